#!/usr/bin/python3
"""Reads the daemon's JSON log lines (log_format_test's LinesForPython, on
stdin) with Python's own json module: each line must be UTF-8 and one JSON
object by RFC 8259 (json.loads is strict about control characters), with
the values that test wrote."""
import json
import sys

MAX_MESSAGE = 16 << 10  # kMaxLogMessageBytes
MAX_FIELD = 256  # kMaxLogFieldBytes


def main() -> int:
    lines = sys.stdin.buffer.read().split(b"\n")
    assert lines[-1] == b"", "the last line has no newline"
    objects = [json.loads(line.decode("utf-8")) for line in lines[:-1]]
    assert len(objects) == 2, f"{len(objects)} lines, not 2"
    first, second = objects
    assert list(first)[:3] == ["time", "level", "message"], list(first)
    assert first["level"] == "info"
    assert first["message"] == 'python \x00\x1f\x7f"\\ \ufffd\ufffd caf\u00e9', first["message"]
    assert first["tenant"] == 't\x01"\\', first["tenant"]
    assert first["kernel"] == "\ufffd(" + "\ufffd" * 7, first["kernel"]
    assert first["peer"] == "p" * (MAX_FIELD - 1) + "\ufffd...", first["peer"]
    assert second["level"] == "error"
    assert second["message"] == "\ufffd" * MAX_MESSAGE + "... (3 bytes more)"
    assert set(second) == {"time", "level", "message"}, set(second)
    print("2 JSON lines read back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
