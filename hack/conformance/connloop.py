#!/usr/bin/env python3
"""connloop.py: open a new TCP connection to HOST:PORT every INTERVAL seconds
until SIGTERM, --duration or --stop-file, each attempt with its own deadline, and write
one line per attempt: start time (Unix seconds), result, milliseconds.

hack/conformance.sh --suite rollout runs it in a client pod's network
namespace (nsenter -n) while the nftpolicy DaemonSet rolls. Results:
  ok       the handshake completed (the SYN was admitted)
  timeout  no answer before the deadline (the SYN or its answer was dropped)
  refused  a reset came back;  unreach  an ICMP error came back
  error:E  any other errno E
Attempts are started on schedule whatever the outstanding ones do (a
non-blocking connect each, polled together), so a dropped SYN does not slow
the loop down, and every attempt is counted once. Connections are closed
with a reset (SO_LINGER 0): no TIME_WAIT, so thousands of attempts do not
use up the ephemeral ports.
"""
import argparse
import errno
import os
import selectors
import signal
import socket
import struct
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="HOST:PORT (an IPv6 HOST with or without brackets)")
    ap.add_argument("--interval", type=float, default=0.007, help="seconds between attempts")
    ap.add_argument("--timeout", type=float, default=0.5, help="deadline of one attempt, seconds")
    ap.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: at SIGTERM)")
    ap.add_argument("--stop-file", help="stop once this file exists (checked every 0.1 s)")
    ap.add_argument("--ready-file", help="created once the first attempt is on its way")
    ap.add_argument("--out", required=True, help="results file (one line per attempt)")
    a = ap.parse_args()
    host, port = a.target.rsplit(":", 1)
    host = host.strip("[]")
    addr = (host, int(port))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if not 0 < a.timeout < 1 or a.interval <= 0:
        sys.exit("connloop: --timeout must be in (0, 1) and --interval positive")

    stop = False

    def on_term(signum, frame):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    linger = struct.pack("ii", 1, 0)
    sel = selectors.DefaultSelector()
    pending = {}  # fd -> (socket, start wall time, start monotonic)
    out = open(a.out, "w", buffering=1 << 16)
    counts = {}

    def record(start_wall, start_mono, result):
        counts[result] = counts.get(result, 0) + 1
        out.write("%.6f %s %.1f\n" % (start_wall, result, (time.monotonic() - start_mono) * 1000))

    def finish(fd, result):
        s, w, m = pending.pop(fd)
        sel.unregister(s)
        record(w, m, result)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
        s.close()

    begin = time.monotonic()
    nxt = begin
    checked = begin
    while True:
        now = time.monotonic()
        if not stop and a.duration and now - begin >= a.duration:
            stop = True
        if not stop and a.stop_file and now - checked >= 0.1:
            checked = now
            stop = os.path.exists(a.stop_file)
        if not stop and now >= nxt:
            nxt = max(nxt + a.interval, now)
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setblocking(False)
            w, m = time.time(), time.monotonic()
            rc = s.connect_ex(addr)
            if a.ready_file:
                open(a.ready_file, "w").close()
                a.ready_file = None
            if rc in (0, errno.EINPROGRESS):
                pending[s.fileno()] = (s, w, m)
                sel.register(s, selectors.EVENT_WRITE)
                if rc == 0:
                    finish(s.fileno(), "ok")
            else:
                record(w, m, classify(rc))
                s.close()
        if stop and not pending:
            break
        # What became writable first, then the deadlines: after a stall of
        # this process (a loaded machine) an attempt that completed in time
        # is not counted as a timeout. A completion seen late is still a
        # first SYN answered: its retransmission would come after 1 s.
        wait = a.timeout if stop else max(0.0, nxt - time.monotonic())
        if pending:
            wait = min(wait, max(0.0, min(m for _, _, m in pending.values()) + a.timeout - time.monotonic()))
        for key, _ in sel.select(timeout=wait) if pending else ():
            s = key.fileobj
            if s.fileno() not in pending:
                continue
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            finish(s.fileno(), "ok" if err == 0 else classify(err))
        now = time.monotonic()
        for fd, (s, w, m) in list(pending.items()):
            if now - m >= a.timeout:
                finish(fd, "timeout")
        if not pending and not stop:
            time.sleep(max(0.0, nxt - time.monotonic()))
    out.close()
    print("connloop %s: %s" % (a.target, " ".join("%s=%d" % kv for kv in sorted(counts.items()))), file=sys.stderr)


def classify(err):
    if err == errno.ECONNREFUSED:
        return "refused"
    if err in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EACCES, errno.EPERM):
        return "unreach"
    if err == errno.ETIMEDOUT:
        return "timeout"
    return "error:" + errno.errorcode.get(err, str(err))


if __name__ == "__main__":
    main()
