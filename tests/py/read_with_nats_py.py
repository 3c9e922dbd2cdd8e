"""Reads a turn, its chat's outbound items and the work queue with nats-py, a client that is not
Turnpike's, to show the data is plain, readable JetStream. Usage: read_with_nats_py.py URL TURN CHAT
Exits 0 and prints what it read; exits 1 with the reason otherwise."""

import asyncio
import json
import sys

import nats


async def main(url: str, turn: str, chat: str) -> int:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        kv = await js.key_value("turnpike_turns")
        record = json.loads((await kv.get(turn)).value)
        if record["state"] != "done" or record["turn"] != turn or record["v"] != 1:
            print(f"unexpected turn record: {record}")
            return 1
        last = await js.get_last_msg("TURNPIKE_CHAT_OUT", f"turnpike.chat.out.{chat}")
        item = json.loads(last.data)
        if item["chat"] != chat or item["turn"] != turn:
            print(f"unexpected outbound item: {item}")
            return 1
        chats = await js.key_value("turnpike_chats")
        chat_record = json.loads((await chats.get(chat)).value)
        info = await js.consumer_info("TURNPIKE_WORK", "runners")
        print(
            f"turn {turn}: state={record['state']} attempts={len(record['attempts'])}; "
            f"last outbound item: {item['kind']} {item['text']!r}; "
            f"chat history entries: {len(chat_record.get('history', []))}; "
            f"work queue pending: {info.num_pending}"
        )
        return 0
    finally:
        await nc.close()


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:4])))
