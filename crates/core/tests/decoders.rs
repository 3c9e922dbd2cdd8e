//! Issue 33: every decoder of outside input, fed arbitrary bytes, answers with a typed error or a
//! value: never a panic, and never more memory than the input could justify. Inbound messages
//! (JSON and MessagePack), runner events, work items, operator requests and kill requests, the
//! records read back from KV, an agent's stdout lines; from random bytes, and from valid
//! payloads with bytes flipped, cut short or lengths declared huge (what reaches the deep paths).
//!
//! The test binary's heap is capped around each decode ([`cap`]): a decoder that allocated by a
//! length the input declares, not by what it holds, would abort the test.

use proptest::prelude::*;
use std::alloc::System;
use turnpike_core::codec::{Codec, CodecError};
use turnpike_core::lifecycle::{self, NewTurn};
use turnpike_core::wire::{
    AgentLine, ChatRecord, InboundMessage, KillRequest, OpsRequest, RunnerEvent, Versioned,
    WorkItem,
};
use turnpike_core::{ChatId, Timestamp, TurnRecord};

#[global_allocator]
static HEAP: cap::Cap<System> = cap::Cap::new(System, usize::MAX);

/// More than any decode of an input this size needs; far less than a declared length could ask.
const DECODE_HEAP: usize = 16 << 20;

/// Run `decode` with the heap capped at what is allocated now plus [`DECODE_HEAP`].
fn bounded<T>(decode: impl FnOnce() -> T) -> T {
    let _ = HEAP.set_limit(HEAP.allocated() + DECODE_HEAP);
    let out = decode();
    let _ = HEAP.set_limit(usize::MAX);
    out
}

/// Every decoder of outside input, on `bytes`: each must return, typed.
fn decode_all(bytes: &[u8]) {
    fn both<T: serde::de::DeserializeOwned + Versioned>(bytes: &[u8]) {
        for codec in [Codec::Json, Codec::Msgpack] {
            let r: Result<T, CodecError> = bounded(|| codec.decode(bytes));
            // A typed answer either way; the error says what it is.
            if let Err(e) = r {
                let _ = e.to_string();
            }
        }
    }
    both::<InboundMessage>(bytes);
    both::<RunnerEvent>(bytes);
    both::<WorkItem>(bytes);
    both::<OpsRequest>(bytes);
    both::<TurnRecord>(bytes);
    both::<ChatRecord>(bytes);
    bounded(|| KillRequest::targets(bytes, 1));
    if let Ok(line) = std::str::from_utf8(bytes) {
        let _: Result<AgentLine, _> = bounded(|| serde_json::from_str(line));
    }
    // Whatever decodes is checked as the dispatcher checks it: also typed, also bounded.
    if let Ok(m) = Codec::Json.decode::<InboundMessage>(bytes) {
        let limits = turnpike_core::wire::InboundLimits {
            message_max: 64 << 10,
            attachments_max: 16,
        };
        let _ = bounded(|| m.check(&limits));
    }
}

/// Valid payloads of each kind, in both codecs: the seeds the mutations start from.
fn seeds() -> Vec<Vec<u8>> {
    let chat = ChatId::new("c").expect("chat");
    let message = InboundMessage::new(chat, "m-1", "hello \u{1}\"", Some("ann".into()));
    let (record, _) = lifecycle::create(
        NewTurn {
            turn: message.turn(),
            message: message.clone(),
            history: Vec::new(),
            max_turn_retry: 3,
            retry_delay: std::time::Duration::from_secs(10),
            rerun_of: None,
            created_by: None,
            admit_now: true,
        },
        Timestamp::from_millis(1_800_000_000_000),
    );
    let work = record.work_item(1);
    let mut out = Vec::new();
    for codec in [Codec::Json, Codec::Msgpack] {
        out.push(codec.encode(&message).expect("encodes"));
        out.push(codec.encode(&record).expect("encodes"));
        out.push(codec.encode(&work).expect("encodes"));
        out.push(
            codec
                .encode(&OpsRequest::turn("op", record.turn.clone()))
                .expect("encodes"),
        );
    }
    out.push(br#"{"type":"message","text":"hi"}"#.to_vec());
    out.push(br#"{"type":"result","status":"error","error":"x"}"#.to_vec());
    out
}

/// A MessagePack `str32`/`bin32`/`array32`/`map32` header declaring almost 4 GiB, then little.
fn huge_headers() -> Vec<Vec<u8>> {
    [0xdbu8, 0xc6, 0xdd, 0xdf]
        .iter()
        .map(|m| vec![0x81, 0xa2, b'i', b'd', *m, 0xff, 0xff, 0xff, 0xf0, b'x'])
        .collect()
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(prop::sample::Index, u8),
    Cut(prop::sample::Index),
    Insert(prop::sample::Index, Vec<u8>),
}

fn mutate(mut bytes: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        match m {
            Mutation::Flip(i, b) if !bytes.is_empty() => {
                let i = i.index(bytes.len());
                bytes[i] ^= b;
            }
            Mutation::Cut(i) if !bytes.is_empty() => bytes.truncate(i.index(bytes.len())),
            Mutation::Insert(i, more) => {
                let i = i.index(bytes.len() + 1);
                bytes.splice(i..i, more.iter().copied());
            }
            _ => {}
        }
    }
    bytes
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<prop::sample::Index>().prop_map(Mutation::Cut),
        (
            any::<prop::sample::Index>(),
            prop::collection::vec(
                prop_oneof![
                    Just(0xdbu8),
                    Just(0xff),
                    Just(b'"'),
                    Just(b'\\'),
                    Just(b'{'),
                    any::<u8>()
                ],
                1..8
            )
        )
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// One test in this binary: the heap cap is the process's, and nothing else may allocate
    /// meanwhile.
    #[test]
    fn every_decoder_of_outside_input_answers_typed_and_bounded(
        random in prop::collection::vec(any::<u8>(), 0..2048),
        seed in any::<prop::sample::Index>(),
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        decode_all(&random);
        let seeds = seeds();
        let base = seeds[seed.index(seeds.len())].clone();
        decode_all(&mutate(base, &mutations));
        for h in huge_headers() {
            decode_all(&h);
        }
    }
}
