//! Attachments (object store `turnpike_attachments`, name `<chat>/<message>/<file>`): put there
//! by chat adapters before they send the message that names them, checked by the dispatcher,
//! fetched by the runner into each attempt.

use async_nats::jetstream::object_store::{GetErrorKind, InfoErrorKind, Object, ObjectInfo};
use tokio::io::AsyncRead;
use turnpike_jetstream::BusError;

use crate::Bus;

/// Looking up or opening an attachment.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// No object of that name: the message names something never stored (or since deleted).
    #[error("object {0:?} is not in the object store")]
    Missing(String),
    /// The store did not answer as it should; trying again later may help.
    #[error(transparent)]
    Bus(#[from] BusError),
}

/// Store `reader`'s bytes as `object` (replacing any object of that name).
pub async fn put(
    bus: &Bus,
    object: &str,
    reader: &mut (impl AsyncRead + Unpin),
) -> Result<ObjectInfo, BusError> {
    bus.attachments
        .put(object, reader)
        .await
        .map_err(|e| BusError::kv(format!("store attachment {object:?}"), e))
}

/// What the store knows of `object` (its size, above all), without reading it.
pub async fn info(bus: &Bus, object: &str) -> Result<ObjectInfo, ObjectError> {
    bus.attachments.info(object).await.map_err(|e| {
        let missing = matches!(
            e.kind(),
            InfoErrorKind::NotFound | InfoErrorKind::InvalidName
        );
        object_error(object, missing, "look up", e)
    })
}

/// Open `object` for reading.
pub async fn open(bus: &Bus, object: &str) -> Result<Object, ObjectError> {
    bus.attachments.get(object).await.map_err(|e| {
        let missing = matches!(e.kind(), GetErrorKind::NotFound | GetErrorKind::InvalidName);
        object_error(object, missing, "read", e)
    })
}

/// `object` is `missing` (no retry brings it), or `doing` it failed as `e` says.
fn object_error(
    object: &str,
    missing: bool,
    doing: &str,
    e: impl Into<turnpike_jetstream::Source>,
) -> ObjectError {
    if missing {
        ObjectError::Missing(object.to_owned())
    } else {
        BusError::kv(format!("{doing} attachment {object:?}"), e).into()
    }
}
