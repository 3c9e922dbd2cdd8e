//! Chat workspaces (object store `turnpike_workspaces`, name `<chat>/<turn>/<attempt>`): a
//! directory an agent keeps between its chat's turns, stored as a tar file. A runner stores what
//! a run left at its clean exit under the attempt's own name; it becomes the chat's (its record's
//! `workspace.current`, the one before kept as `previous`) only by the turn's `SaveWorkspace`
//! effect, and only while the attempt still holds the turn's fence. Every other object of the
//! chat is deleted: a superseded attempt's, and the version before the previous one.

use async_nats::jetstream::object_store::{DeleteErrorKind, GetErrorKind};
use tokio::io::{AsyncRead, AsyncReadExt};
use turnpike_core::fence::FenceHolder;
use turnpike_core::wire::ChatWorkspace;
use turnpike_core::{ChatId, TurnId, TurnRecord};
use turnpike_jetstream::BusError;

use crate::Bus;

/// The object an attempt stores its workspace under.
pub fn object_name(chat: &ChatId, turn: &TurnId, attempt: u32) -> String {
    format!("{chat}/{turn}/{attempt}")
}

/// Store `reader`'s bytes (a tar file) as `object`.
pub async fn put(
    bus: &Bus,
    object: &str,
    reader: &mut (impl AsyncRead + Unpin),
) -> Result<u64, BusError> {
    let info = bus
        .workspaces
        .put(object, reader)
        .await
        .map_err(|e| BusError::kv(format!("store workspace {object:?}"), e))?;
    Ok(info.size as u64)
}

/// `object`'s bytes, at most `max` of them: `Ok(None)` if it is gone (expired, or reset).
/// A larger object is an error, never read whole.
pub async fn get(bus: &Bus, object: &str, max: u64) -> Result<Option<Vec<u8>>, BusError> {
    let mut reader = match bus.workspaces.get(object).await {
        Ok(r) => r,
        Err(e) if matches!(e.kind(), GetErrorKind::NotFound) => return Ok(None),
        Err(e) => return Err(BusError::kv(format!("read workspace {object:?}"), e)),
    };
    let mut bytes = Vec::new();
    (&mut reader)
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| BusError::kv(format!("read workspace {object:?}"), e))?;
    if bytes.len() as u64 > max {
        return Err(BusError::Unrecoverable {
            what: format!("read workspace {object:?}"),
            why: format!("it is over {max} bytes"),
        });
    }
    Ok(Some(bytes))
}

/// Delete `object`; one already gone is no error.
pub async fn delete(bus: &Bus, object: &str) -> Result<(), BusError> {
    match bus.workspaces.delete(object).await {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.kind(), DeleteErrorKind::NotFound) => Ok(()),
        Err(e) => Err(BusError::kv(format!("delete workspace {object:?}"), e)),
    }
}

/// The chat's workspace (`None`: it has none).
pub async fn of_chat(bus: &Bus, chat: &ChatId) -> Result<Option<ChatWorkspace>, BusError> {
    Ok(match crate::chats::read(bus, chat).await?.record() {
        Some(Ok(c)) => c.workspace.clone(),
        _ => None,
    })
}

/// Make `object`, left by `attempt` of `record`'s turn at its clean end, the chat's workspace,
/// if that attempt still holds the turn's fence; else delete it. Idempotent: carried out again,
/// it finds the chat's workspace already `object`.
pub async fn save(
    bus: &Bus,
    record: &TurnRecord,
    attempt: u32,
    object: &str,
) -> Result<(), BusError> {
    let holds = crate::fence::last(bus, &record.turn)
        .await?
        .and_then(|last| last.marker)
        .is_some_and(|m| m.attempt == attempt && matches!(m.holder, FenceHolder::Runner { .. }));
    if !holds {
        tracing::info!(turn_id = %record.turn, attempt, chat_id = %record.chat,
            "workspace not saved: the attempt no longer holds the turn's fence");
        return delete(bus, object).await;
    }
    let dropped = crate::chats::update(bus, &record.chat, |c| match &c.workspace {
        Some(w) if w.current == object => (false, None),
        current => {
            let previous = current.as_ref().map(|w| w.current.clone());
            let dropped = current.as_ref().and_then(|w| w.previous.clone());
            c.workspace = Some(ChatWorkspace {
                current: object.to_owned(),
                previous,
            });
            (true, dropped)
        }
    })
    .await?;
    if let Some(old) = dropped {
        delete(bus, &old).await?;
    }
    Ok(())
}

/// Forget the chat's workspace (its next turn starts empty) and delete its versions. The
/// versions removed, for the operator.
pub async fn reset(bus: &Bus, chat: &ChatId) -> Result<Vec<String>, BusError> {
    let removed = crate::chats::update(bus, chat, |c| match c.workspace.take() {
        Some(w) => (true, std::iter::once(w.current).chain(w.previous).collect()),
        None => (false, Vec::new()),
    })
    .await?;
    for object in &removed {
        delete(bus, object).await?;
    }
    Ok(removed)
}
