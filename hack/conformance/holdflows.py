#!/usr/bin/env python3
"""holdflows.py: long-lived TCP flows for hack/conformance.sh --suite preview.

  holdflows.py serve PORT...            echo every byte back, on each PORT
  holdflows.py hold --out FILE --stop-file F NAME=HOST:PORT...
  holdflows.py probe NAME=HOST:PORT...  one new connection each: "NAME ok PORT"
                                        (its local port) or "NAME fail"

`hold` opens one connection per NAME and keeps it: every 0.5 s it sends a
byte and waits for its echo. It writes one line per event to FILE:
  <unix time> <NAME> up <local port>   the connection is established
  <unix time> <NAME> cut <reason>      no echo within 3 s, or an error
A cut connection is not reopened: the file says which flows a policy change
stopped. The script runs in a pod's network namespace (nsenter -n), so it
sees the pod's addresses only.
"""
import argparse
import os
import select
import socket
import sys
import threading
import time

PING_INTERVAL = 0.5
ECHO_DEADLINE = 3.0


def serve(ports):
    def echo(conn):
        with conn:
            while True:
                try:
                    b = conn.recv(4096)
                except OSError:
                    return
                if not b:
                    return
                try:
                    conn.sendall(b)
                except OSError:
                    return

    def accept(port):
        try:  # both families where the pod has IPv6
            ls = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            ls.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(("::", port))
        except OSError:
            ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            ls.bind(("0.0.0.0", port))
        ls.listen(64)
        while True:
            c, _ = ls.accept()
            threading.Thread(target=echo, args=(c,), daemon=True).start()

    for p in ports:
        threading.Thread(target=accept, args=(int(p),), daemon=True).start()
    while True:
        time.sleep(3600)


def hold(out, stop_file, flows):
    lock = threading.Lock()

    def note(name, what):
        with lock:
            out.write(f"{time.time():.3f} {name} {what}\n")
            out.flush()

    def one(name, host, port):
        try:
            s = socket.create_connection((host, port), timeout=5)
        except OSError as e:
            note(name, f"cut connect:{e.errno}")
            return
        note(name, f"up {s.getsockname()[1]}")
        s.setblocking(False)
        while not os.path.exists(stop_file):
            try:
                s.send(b"x")
            except OSError as e:
                note(name, f"cut send:{e.errno}")
                return
            deadline = time.monotonic() + ECHO_DEADLINE
            got = False
            while time.monotonic() < deadline:
                r, _, _ = select.select([s], [], [], deadline - time.monotonic())
                if r:
                    try:
                        b = s.recv(64)
                    except OSError as e:
                        note(name, f"cut recv:{e.errno}")
                        return
                    if not b:
                        note(name, "cut closed")
                        return
                    got = True
                    break
            if not got:
                note(name, "cut no-echo")
                return
            time.sleep(PING_INTERVAL)
        s.close()

    threads = []
    for f in flows:
        name, _, target = f.partition("=")
        host, _, port = target.rpartition(":")
        t = threading.Thread(target=one, args=(name, host.strip("[]"), int(port)), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()


def probe(flows):
    for f in flows:
        name, _, target = f.partition("=")
        host, _, port = target.rpartition(":")
        try:
            s = socket.create_connection((host.strip("[]"), int(port)), timeout=2)
            print(f"{name} ok {s.getsockname()[1]}", flush=True)
            s.close()
        except OSError:
            print(f"{name} fail", flush=True)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("ports", nargs="+")
    h = sub.add_parser("hold")
    h.add_argument("--out", required=True)
    h.add_argument("--stop-file", required=True)
    h.add_argument("flows", nargs="+")
    p = sub.add_parser("probe")
    p.add_argument("flows", nargs="+")
    a = ap.parse_args()
    if a.cmd == "serve":
        serve(a.ports)
    elif a.cmd == "probe":
        probe(a.flows)
    else:
        with open(a.out, "a") as out:
            hold(out, a.stop_file, a.flows)


if __name__ == "__main__":
    sys.exit(main())
