"""Micro-benchmark for the sans-IO frame codec (not a test).

Decoding: a stream of 256-byte publish frames (4-byte prefix included) is cut into
64 KiB reads, as a socket would deliver them, and fed to one FrameDecoder.
Encoding: encode_frame() of the same header and payload, one frame per call.

Usage: .venv/bin/python tools/bench/bench_codec.py [--frames N] [--repeat R]
Prints the best of R runs; numbers depend on the machine, compare like with like.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from amps_py.protocol import Frame, FrameDecoder, encode_frame

FRAME_SIZE = 256
READ_SIZE = 64 * 1024


def make_frame(seq: int) -> tuple[dict[str, object], bytes]:
    """A publish header and a JSON payload padded so the whole frame is FRAME_SIZE bytes."""
    header: dict[str, object] = {
        "c": "p",
        "t": "orders",
        "cid": str(seq),
        "s": seq,
        "a": "persisted",
    }
    empty = len(encode_frame(header, b'{"id":0,"pad":""}'))
    pad = FRAME_SIZE - empty - len(str(seq)) + 1
    payload = b'{"id":%d,"pad":"%s"}' % (seq, b"x" * pad)
    assert len(encode_frame(header, payload)) == FRAME_SIZE, "frame size drifted"
    return header, payload


def best_of(repeat: int, run: Callable[[], int]) -> tuple[float, int]:
    """Run ``run`` ``repeat`` times; return (best seconds, items it reported)."""
    best = float("inf")
    items = 0
    for _ in range(repeat):
        start = time.perf_counter()
        items = run()
        best = min(best, time.perf_counter() - start)
    return best, items


def bench_decode(frames: int, repeat: int) -> tuple[float, int]:
    stream = b"".join(encode_frame(*make_frame(seq)) for seq in range(frames))
    chunks = [stream[i : i + READ_SIZE] for i in range(0, len(stream), READ_SIZE)]

    def run() -> int:
        decoder = FrameDecoder()
        count = 0
        last: Frame | None = None
        for chunk in chunks:
            decoder.receive_data(chunk)
            for last in decoder.frames():  # noqa: B007 - keep the last frame
                count += 1
        assert last is not None and last.header["s"] == frames - 1
        assert decoder.buffered == 0
        return count

    return best_of(repeat, run)


def bench_encode(frames: int, repeat: int) -> tuple[float, int]:
    header, payload = make_frame(frames)

    def run() -> int:
        for _ in range(frames):
            encode_frame(header, payload)
        return frames

    return best_of(repeat, run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200_000, help="frames per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is reported")
    args = parser.parse_args()

    seconds, count = bench_decode(args.frames, args.repeat)
    mib = count * FRAME_SIZE / seconds / (1 << 20)
    print(
        f"decode: {count / seconds:12,.0f} frames/s  {mib:7.1f} MiB/s  "
        f"({count} x {FRAME_SIZE}-byte publish frames, {READ_SIZE // 1024} KiB reads)"
    )
    seconds, count = bench_encode(args.frames, args.repeat)
    print(f"encode: {count / seconds:12,.0f} frames/s  (encode_frame, {FRAME_SIZE}-byte frames)")


if __name__ == "__main__":
    main()
