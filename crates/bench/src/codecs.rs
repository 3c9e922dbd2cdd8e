//! Measurement 5: JSON against MessagePack for the records and items on the wire.

use super::*;

pub(crate) fn codecs(out: &mut String) -> Result<()> {
    let chat = ChatId::new("bench")?;
    let history: Vec<HistoryEntry> = (0..50)
        .map(|i| HistoryEntry {
            role: if i % 2 == 0 { Role::User } else { Role::Bot },
            text: format!("message {i}: {}", "lorem ipsum dolor sit amet ".repeat(6)),
        })
        .collect();
    let work = WorkItem {
        workspace: None,
        v: FORMAT_VERSION,
        turn: TurnId::for_message(&chat, "m"),
        chat: chat.clone(),
        attempt: 2,
        max_attempts: 3,
        message: inbound(&chat, "m", "please summarise the thread"),
        history,
        profile: None,
    };
    writeln!(
        out,
        "\n### 5. Codecs (attempt payload with 50 history messages)\n"
    )?;
    writeln!(out, "| codec | bytes | encode + decode |")?;
    writeln!(out, "|---|---|---|")?;
    let iterations = 20_000;
    let mut rows = Vec::new();
    for codec in [Codec::Json, Codec::Msgpack] {
        let bytes = codec.encode(&work)?;
        let start = Instant::now();
        for _ in 0..iterations {
            let b = codec.encode(std::hint::black_box(&work))?;
            let back: WorkItem = codec.decode(&b)?;
            std::hint::black_box(back);
        }
        let each = start.elapsed() / iterations;
        rows.push((codec, bytes.len(), each));
    }
    for (codec, size, each) in &rows {
        writeln!(
            out,
            "| {codec:?} | {size} | {:.1} µs |",
            each.as_secs_f64() * 1e6
        )?;
    }
    let (json, mp) = (&rows[0], &rows[1]);
    writeln!(
        out,
        "\nMessagePack is {:.2}× the size of JSON and takes {:.2}× the time.",
        mp.1 as f64 / json.1 as f64,
        mp.2.as_secs_f64() / json.2.as_secs_f64()
    )?;
    Ok(())
}
