#!/usr/bin/env python3
"""Client of bench/eventloop.sh: what big prompts cost the other requests of
an nginx worker.

  eventloop.py --port P idle  [--dur S]
  eventloop.py --port P flood [--dur S] [--clients 4] [--bytes 1000000]
  eventloop.py --port P big   [--mb 10] [--reps 3]

The probe is a 2-token greedy completion ("In the beginning", max_tokens 2)
on its own connection, sent back to back; its latency is request written ->
response read.  --probe health: GET /v1/health instead, which the event
loop answers without an engine (what the loop alone costs, apart from the
engine's share of the cores).  idle: the probe alone.  flood: the probe while CLIENTS
processes (not threads: no shared interpreter lock with the probe) send
prompts of BYTES bytes of JSON over and over (each refused: longer than the
context).  big: REPS times, one MB-megabyte prompt is sent to /big/v1/
(client_max_body_size 64m) while the probe runs; reported: the probe's
latencies from the big body's first byte to its answer.  One JSON line per
run on stdout.
"""
import argparse
import json
import multiprocessing
import socket
import statistics
import time

PROBE = json.dumps({"prompt": "In the beginning", "max_tokens": 2,
                    "temperature": 0}).encode()


def post(port, path, body, timeout=120):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    head = ("POST %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (path, len(body))).encode()
    s.sendall(head + body)
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0
    return status


PROBE_KIND = "completion"


def get(port, path, timeout=120):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(("GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close"
               "\r\n\r\n" % path).encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/") else 0


def probe_once(port):
    t0 = time.perf_counter()
    if PROBE_KIND == "health":
        status = get(port, "/v1/health")
    else:
        status = post(port, "/v1/completions", PROBE)
    return (time.perf_counter() - t0) * 1e3, status


def summary(lat, **extra):
    lat = sorted(lat)
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    d = {"n": len(lat), "p50_ms": round(q(0.50), 2),
         "p99_ms": round(q(0.99), 2), "max_ms": round(lat[-1], 2),
         "mean_ms": round(statistics.mean(lat), 2)}
    d.update(extra)
    return d


def probe_for(port, dur):
    lat, bad = [], 0
    end = time.perf_counter() + dur
    while time.perf_counter() < end:
        ms, status = probe_once(port)
        lat.append(ms)
        bad += status != 200
    return lat, bad


def flooder(port, nbytes, stop_at, counts, k):
    filler = "In the beginning God created the heaven and the earth. "
    text = (filler * (nbytes // len(filler) + 1))[: nbytes - 64]
    body = json.dumps({"prompt": text, "max_tokens": 2}).encode()
    n = 0
    while time.time() < stop_at:
        post(port, "/v1/completions", body)
        n += 1
    counts[k] = n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["idle", "flood", "big"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dur", type=float, default=10)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--bytes", type=int, default=1000000)
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--probe", choices=["completion", "health"],
                    default="completion")
    a = ap.parse_args()
    global PROBE_KIND
    PROBE_KIND = a.probe

    if a.mode == "idle":
        lat, bad = probe_for(a.port, a.dur)
        print(json.dumps(summary(lat, mode="idle", probe=a.probe,
                                 non_200=bad)))
        return

    if a.mode == "flood":
        stop_at = time.time() + a.dur + 1
        counts = multiprocessing.Array("i", a.clients)
        procs = [multiprocessing.Process(target=flooder,
                                         args=(a.port, a.bytes, stop_at,
                                               counts, k))
                 for k in range(a.clients)]
        for p in procs:
            p.start()
        time.sleep(1)  # every flooder is sending
        lat, bad = probe_for(a.port, a.dur)
        for p in procs:
            p.join()
        print(json.dumps(summary(lat, mode="flood", probe=a.probe,
                                 clients=a.clients,
                                 body_bytes=a.bytes, non_200=bad,
                                 flood_requests=sum(counts))))
        return

    # big: the probe runs in this process, the big body in another
    filler = "And God said, Let there be light: and there was light. "
    nbytes = int(a.mb * 1e6)
    text = (filler * (nbytes // len(filler) + 1))[:nbytes]
    body = json.dumps({"prompt": text, "max_tokens": 2}).encode()
    for rep in range(a.reps):
        done = multiprocessing.Value("d", 0.0)
        started = multiprocessing.Value("d", 0.0)

        def send(started=started, done=done):
            started.value = time.time()
            post(a.port, "/big/v1/completions", body)
            done.value = time.time()

        p = multiprocessing.Process(target=send)
        lat_in = []
        p.start()
        while done.value == 0.0:
            t_send = time.time()
            ms, _ = probe_once(a.port)
            # sent while the big body was being sent or processed
            if started.value and t_send >= started.value \
                    and (done.value == 0.0 or t_send < done.value):
                lat_in.append(ms)
        p.join()
        print(json.dumps(summary(lat_in or [0.0], mode="big", rep=rep,
                                 probe=a.probe,
                                 body_bytes=len(body),
                                 big_ms=round((done.value - started.value)
                                              * 1e3, 1))))


if __name__ == "__main__":
    main()
