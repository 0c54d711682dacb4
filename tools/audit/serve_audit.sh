#!/usr/bin/env bash
# Hand-run attack audit of wm_serve over loopback (127.0.0.1 only): the defects its hardening
# fixed, each as a case that starts its own server (--port 0, --threads 1, the embedded model)
# with a state folder inside the case's temporary folder, beside a sentinel tree (files the server
# must never touch, checksummed before and after). Each case records: crashes (a signal the audit
# did not send, "terminate called"), files touched outside the state folder, answered sessions
# lost (a session whose request got 200, and whose answer did not say X-Session-Saved: false,
# must still be listed by GET /v1/sessions/ID after a restart on the same folder, where the case
# restarts), and the HTTP statuses seen. Every loop is bounded in count and time; the clients are
# curl and python3 (standard library only). Prints a Markdown table and a summary line; exits
# non-zero when a case crashed, touched a file outside, lost an answered session or did not do
# what it should.
#   bash tools/audit/serve_audit.sh [BUILD_DIR]       (default: build; about 90 s on 2 cores)
# SERVE_AUDIT_KEEP=1 keeps the temporary folder (the cases' folders, the servers' logs).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
serve="$build/tools/serve/wm_serve"
[ -x "$serve" ] || { echo "serve_audit: $serve is not built" >&2; exit 2; }
command -v curl >/dev/null && command -v python3 >/dev/null || { echo "serve_audit: needs curl and python3" >&2; exit 2; }
work="$(mktemp -d "${TMPDIR:-/tmp}/wm_serve_audit.XXXXXX")"
logs="$work/logs"
mkdir -p "$logs"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  if [ -n "${SERVE_AUDIT_KEEP:-}" ]; then echo "serve_audit: the cases' folders and logs are in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
py="$work/client.py"

cat >"$py" <<'EOF'
# The audit's HTTP clients. Each command prints what it saw (one line) and exits 0 when that is
# what should happen, 1 otherwise; "minor" prints table rows (id, expected, observed, ok).
import http.client, json, os, select, signal, socket, statistics, sys, threading, time

ANSWERED = os.environ.get("ANSWERED", "")
MODEL = "tiny-llm"


def call(port, method, path, body=None, headers=None, timeout=60):
    h = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    except (OSError, http.client.HTTPException) as e:
        return "exc:" + type(e).__name__, {}, b""
    finally:
        c.close()


def note_answer(status, hdrs, session, key=""):
    """An answered session request: the session must survive a restart (unless its save failed)."""
    if ANSWERED and status == 200 and session and hdrs.get("x-session-saved", "true") != "false":
        with open(ANSWERED, "a") as f:
            f.write(f"{session}\t{key}\n")


def sse(data):
    """A stream's events: (JSON objects, problem or '')."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return [], f"not UTF-8 ({e})"
    evs, done = [], False
    for block in text.split("\n\n"):
        block = block.strip("\r\n")
        if not block:
            continue
        if done:
            return evs, "an event after [DONE]"
        if not block.startswith("data: "):
            return evs, f"not an event: {block[:40]!r}"
        if block[6:] == "[DONE]":
            done = True
            continue
        try:
            evs.append(json.loads(block[6:]))
        except ValueError:
            return evs, f"not JSON: {block[6:46]!r}"
    return evs, "" if done else "no [DONE]"


def counts(statuses):
    out = {}
    for s in statuses:
        out[s] = out.get(s, 0) + 1
    return " ".join(f"{k}x{v}" for k, v in sorted(out.items(), key=lambda kv: str(kv[0])))


def recall_prompt(reps, salt=0):
    return "".join("The key %d opens it. " % ((i + salt) * 7919 % 1000) for i in range(reps))


def cmd_burst(port):
    """Case 1: temperature 2.0, seeds 1..200, whole and streamed (the streams in two sessions)."""
    port = int(port)
    whole, stream, bad = [], [], []
    deadline = time.time() + 150

    def run_whole():
        for s in range(1, 201):
            if time.time() > deadline:
                break
            st, h, d = call(port, "POST", "/v1/completions",
                            {"model": MODEL, "prompt": "x", "temperature": 2.0, "seed": s, "max_tokens": 16})
            whole.append(st)
            if st == 200:
                try:
                    j = json.loads(d.decode("utf-8"))
                    assert isinstance(j["choices"][0]["text"], str)
                except Exception as e:
                    bad.append(f"whole seed {s}: {type(e).__name__}")

    def run_stream():
        for s in range(1, 201):
            if time.time() > deadline:
                break
            sid = "hot-a" if s <= 100 else "hot-b"
            st, h, d = call(port, "POST", "/v1/completions",
                            {"model": MODEL, "prompt": "x", "temperature": 2.0, "seed": s, "max_tokens": 16,
                             "stream": True}, {"X-Session-Id": sid})
            stream.append(st)
            if st == 200:
                evs, prob = sse(d)
                if not prob and (not evs or evs[-1]["choices"][0].get("finish_reason") not in ("length", "stop")):
                    prob = "no finish_reason at the end"
                if prob:
                    bad.append(f"stream seed {s}: {prob}")
                else:
                    note_answer(st, h, sid)

    ts = [threading.Thread(target=run_whole), threading.Thread(target=run_stream)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(160)
    alive = call(port, "GET", "/health", timeout=5)[0]
    sess = []
    for sid in ("hot-a", "hot-b"):
        st, _, d = call(port, "GET", "/v1/sessions/" + sid)
        turns = json.loads(d).get("turns") if st == 200 else None
        sess.append(f"{sid} {st} turns {turns}")
    ok = (whole.count(200) == 200 and stream.count(200) == 200 and not bad and alive == 200
          and all(" 200 turns 100" in s for s in sess))
    print(f"whole: {counts(whole)}; streamed: {counts(stream)}; {len(bad)} bad bodies"
          f"{' (' + bad[0] + ')' if bad else ''}; /health {alive}; {', '.join(sess)}")
    return ok


def cmd_sessions(port, *names):
    """One short completion in each named session; prints the statuses."""
    port, sts = int(port), []
    for n in names:
        st, h, _ = call(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "rode 42\n", "max_tokens": 2},
                        {"X-Session-Id": n})
        note_answer(st, h, n)
        sts.append(st)
    print(counts(sts))
    return all(s == 200 for s in sts)


def cmd_get(port, *names):
    """GET /v1/sessions/NAME for each: prints NAME STATUS."""
    port, sts = int(port), []
    for n in names:
        sts.append(f"{n} {call(port, 'GET', '/v1/sessions/' + n)[0]}")
    print(", ".join(sts))
    return all(s.endswith(" 200") for s in sts)


def cmd_lost(port, path):
    """The answered sessions (NAME\\tKEY lines) that GET /v1/sessions/NAME no longer finds."""
    port = int(port)
    seen, lost = set(), []
    if os.path.exists(path):
        for line in open(path):
            name, _, key = line.rstrip("\n").partition("\t")
            if (name, key) in seen:
                continue
            seen.add((name, key))
            h = {"Authorization": "Bearer " + key} if key else {}
            st = call(port, "GET", "/v1/sessions/" + name, headers=h)[0]
            if st != 200:
                lost.append(f"{name}:{st}")
    print(f"{len(lost)} of {len(seen)}" + (f" ({' '.join(lost[:5])})" if lost else ""))
    return not lost


def chunked_upload(port, mib, out, i):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
    frame = b"10000\r\n" + b"a" * 65536 + b"\r\n"
    sent, deadline = 0, time.time() + 40
    try:
        while sent < mib << 20 and time.time() < deadline:
            s.sendall(frame)
            sent += 65536
            if select.select([s], [], [], 0)[0]:
                break
        else:
            s.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    data = b""
    try:
        while time.time() < deadline and len(data) < 65536:
            r = s.recv(65536)
            if not r:
                break
            data += r
    except OSError as e:
        if not data:
            data = b"reset " + type(e).__name__.encode()
    s.close()
    st = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else data[:20].decode(errors="replace")
    out[i] = f"{st} after {sent >> 20} MiB"


def cmd_chunked(port, mib, n):
    """n parallel chunked uploads of mib MiB each."""
    port, mib, n = int(port), int(mib), int(n)
    out = [""] * n
    ts = [threading.Thread(target=chunked_upload, args=(port, mib, out, i)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    print(", ".join(out))
    return all(o.startswith("413 ") for o in out)


def cmd_long(port):
    """Case 5: eight concurrent requests on one session (policy full), ~950 prompt tokens and 256 more each."""
    port = int(port)
    sts, reasons = [], []
    lock = threading.Lock()

    def one(i):
        st, h, d = call(port, "POST", "/v1/completions",
                        {"model": MODEL, "prompt": recall_prompt(120, i * 13), "max_tokens": 256}, {"X-Session-Id": "long"},
                        timeout=120)
        with lock:
            sts.append(st)
            if st == 200:
                reasons.append(json.loads(d)["choices"][0]["finish_reason"])
        note_answer(st, h, "long")

    ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(150)
    st, _, d = call(port, "GET", "/v1/sessions/long")
    pos = json.loads(d).get("position") if st == 200 else None
    print(f"{counts(sts)} (finish {counts(reasons)}); position {pos}")
    return pos is not None and pos <= 4096 and set(sts) <= {200, 400}


def cmd_position(port, name):
    st, _, d = call(int(port), "GET", "/v1/sessions/" + name)
    pos = json.loads(d).get("position") if st == 200 else None
    print(f"{st} position {pos}")
    return pos is not None and pos <= 4096


def cmd_many(port, first, last):
    """Sessions first..last, each with a ~475-token prompt; prints how many answers said X-Session-Saved: false."""
    port, sts, unsaved = int(port), [], 0
    for i in range(int(first), int(last) + 1):
        st, h, _ = call(port, "POST", "/v1/completions",
                        {"model": MODEL, "prompt": recall_prompt(60, i), "max_tokens": 2}, {"X-Session-Id": f"m{i}"})
        sts.append(st)
        unsaved += h.get("x-session-saved") == "false"
    print(f"{counts(sts)}, {unsaved} with X-Session-Saved: false")
    return all(s == 200 for s in sts) and unsaved == len(sts)


def cmd_keepalive(port):
    """Case 7: 50 GET /health on one keep-alive connection, 50 on new connections (medians in ms)."""
    port = int(port)
    ka, fresh, sts = [], [], []
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    for _ in range(50):
        t = time.perf_counter()
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        ka.append((time.perf_counter() - t) * 1000)
        sts.append(r.status)
    c.close()
    for _ in range(50):
        t = time.perf_counter()
        st = call(port, "GET", "/health", timeout=5)[0]
        fresh.append((time.perf_counter() - t) * 1000)
        sts.append(st)
    a, b = statistics.median(ka), statistics.median(fresh)
    print(f"keep-alive median {a:.2f} ms, new connection {b:.2f} ms; {counts(sts)}")
    return a <= 2 * b and all(s == 200 for s in sts)


def cmd_slow(port):
    """Case 8: four clients sending a header line every 3 s; /health timed meanwhile."""
    port = int(port)
    socks = []
    for i in range(4):
        s = socket.create_connection(("127.0.0.1", port), timeout=15)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        socks.append(s)
    times, sts = [], []
    start = time.time()
    nxt = start + 3
    for probe in (1.0, 2.0, 4.0, 5.0, 7.0, 8.0):
        while time.time() < start + probe:
            if time.time() >= nxt:
                for s in socks:
                    try:
                        s.sendall(b"X-Slow: %d\r\n" % int(time.time()))
                    except OSError:
                        pass
                nxt += 3
            time.sleep(0.05)
        t = time.perf_counter()
        st = call(port, "GET", "/health", timeout=5)[0]
        times.append(time.perf_counter() - t)
        sts.append(st)
    got = []
    for s in socks:
        data = b""
        s.settimeout(max(0.5, start + 14 - time.time()))
        try:
            while True:
                r = s.recv(4096)
                if not r:
                    break
                data += r
        except OSError:
            pass
        s.close()
        got.append(data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1 ") else "none")
    print(f"/health {counts(sts)}, slowest {max(times) * 1000:.0f} ms; the slow clients got {counts(got)}")
    return max(times) < 1.0 and all(s == 200 for s in sts)


def cmd_pipeline(port):
    """Case 9: three GET /health in one send."""
    s = socket.create_connection(("127.0.0.1", int(port)), timeout=5)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\nGET /health HTTP/1.1\r\nHost: a\r\n\r\n"
              b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    data, deadline = b"", time.time() + 5
    try:
        while time.time() < deadline and data.count(b"HTTP/1.1 ") < 3:
            r = s.recv(4096)
            if not r:
                break
            data += r
    except OSError:
        pass
    s.close()
    n = data.count(b"HTTP/1.1 200")
    print(f"{n} responses 200 ({data.count(b'HTTP/1.1 ')} in all)")
    return n == 3


def cmd_cut(port, pid):
    """Case 10: a whole and a streamed generation of 1024 tokens, SIGTERM 0.3 s into them."""
    port, pid = int(port), int(pid)
    res = {}

    def whole():
        res["whole"] = call(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1024},
                            {"X-Session-Id": "cut-whole"})

    def stream():
        res["stream"] = call(port, "POST", "/v1/completions",
                             {"model": MODEL, "prompt": "x", "max_tokens": 1024, "stream": True},
                             {"X-Session-Id": "cut-stream"})

    ts = [threading.Thread(target=whole), threading.Thread(target=stream)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    os.kill(pid, signal.SIGTERM)
    for t in ts:
        t.join(30)
    st, h, d = res.get("whole", ("none", {}, b""))
    try:
        code_w = json.loads(d)["error"]["code"]
    except Exception:
        code_w = "no error object" if st != 200 else "finish " + str(json.loads(d)["choices"][0]["finish_reason"])
    st2, h2, d2 = res.get("stream", ("none", {}, b""))
    evs, prob = sse(d2)
    last = evs[-1] if evs else {}
    code_s = last["error"].get("code") if "error" in last else "finish " + str(
        (last.get("choices") or [{}])[0].get("finish_reason"))
    stops = sum(1 for e in evs if (e.get("choices") or [{}])[0].get("finish_reason") == "stop")
    print(f"whole: {st} {code_w}; stream: {st2}, {len(evs)} events, last {code_s}"
          f"{', ' + prob if prob else ''}{', a finish_reason stop' if stops else ''}")
    return st == 503 and code_w == "server_shutdown" and code_s == "server_shutdown" and not prob and not stops


def cmd_hup(port, pid):
    """Case 10b: SIGHUP during a request: the request finishes (200)."""
    port, pid = int(port), int(pid)
    res = {}
    t = threading.Thread(target=lambda: res.setdefault("r", call(
        port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 256}, {"X-Session-Id": "hup"})))
    t.start()
    time.sleep(0.1)
    os.kill(pid, signal.SIGHUP)
    t.join(30)
    st, h, d = res.get("r", ("none", {}, b""))
    note_answer(st, h, "hup")
    print(f"the request under way: {st}")
    return st == 200


def cmd_ids(port, path, mode):
    """Response ids: 'save' appends three to path, 'check' gets three more and compares."""
    port = int(port)
    ids = []
    for i in range(3):
        st, _, d = call(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 1},
                        {"Authorization": "Bearer " + os.environ["KEY_A"]})
        ids.append(json.loads(d)["id"] if st == 200 else f"status {st}")
    if mode == "save":
        with open(path, "a") as f:
            f.write("\n".join(ids) + "\n")
        print(" ".join(ids))
        return True
    before = open(path).read().split()
    same = set(before) & set(ids)
    print(f"{len(before)} ids before, {len(ids)} after, {len(same)} the same ({before[0]} / {ids[0]})")
    return not same and all(not i.startswith("status") for i in ids)


def raw(port, data, timeout=5):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    got, deadline = b"", time.time() + timeout
    try:
        while time.time() < deadline:
            r = s.recv(65536)
            if not r:
                break
            got += r
    except OSError:
        pass
    s.close()
    return got


def error_object(d):
    try:
        e = json.loads(d)["error"]
        return isinstance(e["message"], str) and "type" in e
    except Exception:
        return False


def cmd_minor(port):
    """Case 11 on a server with --api-key-file (keys KEY_A, KEY_B) and --max-body-bytes 4096."""
    port = int(port)
    A, B = os.environ["KEY_A"], os.environ["KEY_B"]
    auth = {"Authorization": "Bearer " + A}
    rows = []

    def row(i, exp, obs, ok):
        rows.append(f"{i}\t{exp}\t{obs}\t{'yes' if ok else 'NO'}")

    st = call(port, "GET", "/v1/models", headers={"Authorization": "bearer " + A})[0]
    st0 = call(port, "GET", "/v1/models")[0]
    row("11a", "'Authorization: bearer KEY' (--api-key-file): 200; none: 401", f"{st}; none: {st0}",
        st == 200 and st0 == 401)

    body = b'{"model":"tiny-llm","prompt":"\xff\xfe bad","max_tokens":1}'
    st, _, d = call(port, "POST", "/v1/completions", body, dict(auth, **{"Content-Type": "application/json"}))
    row("11b", "invalid UTF-8 in a JSON body: 400", f"{st}{'' if error_object(d) else ' (no error object)'}", st == 400)

    body = b'{"model":"tiny-llm","prompt":"x","max_tokens":1}'
    got = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer " + A.encode() +
              b"\r\nX-Session-Id: abc\x00def\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
              b"Connection: close\r\n\r\n" % len(body) + body)
    st = got.split(b" ", 2)[1].decode() if got.startswith(b"HTTP/1.1 ") else "none"
    row("11c", "'X-Session-Id: abc\\0def' raw: 400", st, st == "400")

    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 4, "stream": True}).encode()
    got = raw(port, b"POST /v1/completions HTTP/1.0\r\nHost: a\r\nAuthorization: Bearer " + A.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body, timeout=10)
    head, _, rest = got.partition(b"\r\n\r\n")
    chunked = b"transfer-encoding: chunked" in head.lower()
    st = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/1.") else "none"
    row("11d", "HTTP/1.0 streamed request: 200, no Transfer-Encoding: chunked, ends with [DONE]",
        f"{st}, {'chunked' if chunked else 'not chunked'}, {'[DONE]' if b'data: [DONE]' in rest else 'no [DONE]'}",
        st == "200" and not chunked and b"data: [DONE]" in rest)

    st4, _, d4 = call(port, "GET", "/nowhere", headers=auth)
    st13, _, d13 = call(port, "POST", "/v1/completions", b'{"prompt":"' + b"a" * 8000 + b'"}',
                        dict(auth, **{"Content-Type": "application/json"}))
    row("11e", "404 and 413 bodies: OpenAI error JSON",
        f"{st4} {'error JSON' if error_object(d4) else repr(d4[:40])}; {st13} {'error JSON' if error_object(d13) else repr(d13[:40])}",
        st4 == 404 and st13 == 413 and error_object(d4) and error_object(d13))

    st, _, d = call(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_completion_tokens": 3}, auth)
    n = json.loads(d)["usage"]["completion_tokens"] if st == 200 else None
    row("11f", "max_completion_tokens 3: 3 tokens", f"{st}, {n} tokens", st == 200 and n == 3)

    st, _, d = call(port, "POST", "/v1/chat/completions",
                    {"model": MODEL, "max_tokens": 2, "messages": [
                        {"role": "developer", "content": "Be brief."},
                        {"role": "user", "content": [{"type": "text", "text": "rode 42"}, {"type": "text", "text": "Recall: rode"}]}]},
                    auth)
    row("11g", "developer role and content-part arrays: 200", f"{st}", st == 200)

    st1 = call(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "stop": ""}, auth)[0]
    st2 = call(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "stop": [""]}, auth)[0]
    row("11h", "'\"stop\": \"\"' and '[\"\"]': 200 and 200", f"{st1} and {st2}", st1 == 200 and st2 == 200)

    chat = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "rode 42"}]}
    hk = dict(auth, **{"X-Session-Id": "idem", "Idempotency-Key": "retry-1"})
    st1, h1, d1 = call(port, "POST", "/v1/chat/completions", chat, hk)
    note_answer(st1, h1, "idem", A)
    st2, h2, d2 = call(port, "POST", "/v1/chat/completions", chat, hk)
    stg, _, dg = call(port, "GET", "/v1/sessions/idem", headers=auth)
    turns = json.loads(dg).get("turns") if stg == 200 else None
    same = st1 == 200 and st2 == 200 and json.loads(d1)["choices"] == json.loads(d2)["choices"]
    row("11j", "a retried chat, same Idempotency-Key: Idempotency-Replayed: true, turns 1",
        f"{st1}, {st2} replayed {h2.get('idempotency-replayed')}, {'same' if same else 'other'} answer; turns {turns}",
        h2.get("idempotency-replayed") == "true" and turns == 1 and same)

    st1, h1, _ = call(port, "POST", "/v1/completions", {"model": MODEL, "prompt": "rode 42\n", "max_tokens": 2},
                      dict(auth, **{"X-Session-Id": "mine"}))
    note_answer(st1, h1, "mine", A)
    kb = {"Authorization": "Bearer " + B}
    g = call(port, "GET", "/v1/sessions/mine", headers=kb)[0]
    dl = call(port, "DELETE", "/v1/sessions/mine", headers=kb)[0]
    ga = call(port, "GET", "/v1/sessions/mine", headers=auth)[0]
    row("11m", "two keys: key B's GET and DELETE of key A's session: 404, 404; key A still 200",
        f"{st1}; B: {g}, {dl}; A: {ga}", st1 == 200 and g == 404 and dl == 404 and ga == 200)
    print("\n".join(rows))
    return all(r.endswith("\tyes") for r in rows)


def cmd_envkey(port):
    """Case 11l: the key from WM_SERVE_API_KEY."""
    port = int(port)
    st0 = call(port, "GET", "/v1/models")[0]
    st1 = call(port, "GET", "/v1/models", headers={"Authorization": "Bearer " + os.environ["KEY_E"]})[0]
    print(f"with the key: {st1}; without: {st0}")
    return st0 == 401 and st1 == 200


if __name__ == "__main__":
    sys.exit(0 if globals()["cmd_" + sys.argv[1]](*sys.argv[2:]) else 1)
EOF

client() { timeout -s KILL "${client_limit:-200}" python3 "$py" "$@"; }

rows=()
ncases=0 crashes=0 touched=0 lost=0 bad=0
ka_ms="?" new_ms="?"

# A listing of the case's folder outside its state folder, with checksums: what the server must not touch.
outside_listing() {
  (cd "$cdir" && find . -path ./a/b/c/state -prune -o \( -type f -printf '%p %s ' -exec sh -c 'cksum < "$1" | cut -d" " -f1' _ {} \; \) -o \( ! -type f ! -name . -printf '%p %y %l\n' \) | sort)
}

# begin ID: the case's folder, its state folder a/b/c/state and a sentinel tree beside it.
begin() {
  cid="$1"
  cdir="$work/case$1"
  state="$cdir/a/b/c/state"
  meta="$cdir.meta"   # the audit's own files (answered sessions, keys, ids), outside the sentinel tree
  mkdir -p "$state" "$cdir/outside/deep" "$meta"
  echo "sentinel $cid" >"$cdir/SENTINEL"
  echo "sentinel2 $cid" >"$cdir/sentinel2"
  echo "beside the state folder" >"$cdir/a/b/c/notes.txt"
  head -c 4096 /dev/urandom >"$cdir/outside/deep/blob"
  export ANSWERED="$meta/answered"
  : >"$ANSWERED"
  c_crash="" c_lost=0 c_notes="" c_touched="" srv_n=0
  before_outside="$(outside_listing)"
}

alive() { [ -e "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$spid/status" 2>/dev/null; }
hwm() { awk '/^VmHWM/ {print $2}' "/proc/$spid/status" 2>/dev/null; }

# srv_start ARGS...: wm_serve --port 0 --threads 1 ARGS in the background (run from the repository,
# prefixed with $wrap, environment $srv_env; logs through pipes when $pipe_logs is set, for a
# server whose file size is limited). Sets spid and port; returns 1 when it did not start.
srv_start() {
  srv_n=$((srv_n + 1))
  sout="$logs/$cid.$srv_n.out" serr="$logs/$cid.$srv_n.err"
  if [ -n "${pipe_logs:-}" ]; then
    (cd "$root" && exec env ${srv_env:-} ${wrap:-} "$serve" --port 0 --threads 1 "$@" </dev/null > >(exec cat >"$sout") 2> >(exec cat >"$serr")) &
  else
    (cd "$root" && exec env ${srv_env:-} ${wrap:-} "$serve" --port 0 --threads 1 "$@" </dev/null >"$sout" 2>"$serr") &
  fi
  spid=$!
  pids+=("$spid")
  port=""
  local i
  for i in $(seq 1 300); do
    port="$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$sout" 2>/dev/null | sed 's/.*://')"
    [ -n "$port" ] && return 0
    alive "$spid" || break
    sleep 0.05
  done
  c_notes="$c_notes; server $srv_n did not start: $(head -c 150 "$serr" | tr '\n' ' ')"
  srv_stop KILL
  return 1
}

# srv_stop [SIGNAL|none]: signals the server (TERM by default; none: it was signalled already, by
# TERM or HUP in $sent), waits for it (15 s, then SIGKILL and "did not exit") and records a crash:
# a signal it was not sent, or "terminate called" on its standard error. Sets src.
srv_stop() {
  local sig="${1:-TERM}" i
  [ "$sig" = none ] || { sent="$sig"; kill -s "$sig" "$spid" 2>/dev/null; }
  for i in $(seq 1 300); do alive "$spid" || break; sleep 0.05; done
  killed=0
  if alive "$spid"; then
    kill -KILL "$spid" 2>/dev/null
    killed=1
    c_notes="$c_notes; server $srv_n did not exit within 15 s of SIG$sent"
    c_bad=1
  fi
  wait "$spid" 2>/dev/null
  src=$?
  sleep 0.05
  local signo
  signo="$(kill -l "$sent" 2>/dev/null || echo 0)"
  if [ "$src" -ge 128 ] && [ "$src" -ne $((128 + signo)) ] && { [ "$src" -ne 137 ] || [ "$killed" -eq 0 ]; }; then c_crash="$c_crash signal $((src - 128))"; fi
  grep -qE 'terminate called|Segmentation fault|AddressSanitizer|core dumped' "$serr" 2>/dev/null && c_crash="$c_crash abort"
  return 0
}

# lost_check: on the running server, the case's answered sessions that it no longer lists.
lost_check() {
  local out
  out="$(client lost "$port" "$ANSWERED")"
  c_lost=$((c_lost + ${out%% *}))
  c_notes="$c_notes; lost after restart: $out"
}

# outside_check: files outside the state folder changed since begin (or the last check): counted,
# named in the row, and the listing taken again.
outside_check() {
  local after changed
  after="$(outside_listing)"
  if [ "$after" != "$before_outside" ]; then
    changed="$(diff <(echo "$before_outside") <(echo "$after") | grep '^[<>]' | cut -d' ' -f2 | sort -u | tr '\n' ' ')"
    c_touched="$c_touched $changed"
    touched=$((touched + $(echo "$changed" | wc -w)))
  fi
  before_outside="$after"
}

# finish EXPECTED OBSERVED OK: the case's row, with crashes, files touched outside and sessions lost.
finish() {
  local exp="$1" obs="$2" ok="$3"
  outside_check
  [ -n "$c_touched" ] && { obs="$obs; TOUCHED OUTSIDE:$c_touched"; ok=0; }
  if [ -n "$c_crash" ]; then obs="$obs; CRASH$c_crash"; crashes=$((crashes + 1)); ok=0; fi
  [ "$c_lost" -gt 0 ] && { lost=$((lost + c_lost)); ok=0; }
  [ "${c_bad:-0}" -eq 1 ] && ok=0
  c_bad=0
  obs="$obs$c_notes"
  obs="${obs//|/\\|}"
  ncases=$((ncases + 1))
  [ "$ok" -eq 1 ] || bad=$((bad + 1))
  rows+=("| $cid | ${exp//|/\\|} | $obs | $([ "$ok" -eq 1 ] && echo yes || echo NO) |")
  echo "serve_audit: case $cid $([ "$ok" -eq 1 ] && echo ok || echo NOT OK)" >&2
}
c_bad=0 sent=TERM

# --- 1. temperature 2.0, seeds 1..200, whole and streamed ---------------------------------------
begin 1
obs="server did not start" ok=0
if srv_start --state-dir "$state"; then
  obs="$(client burst "$port")" && ok=1
  srv_stop
  if srv_start --state-dir "$state"; then lost_check; srv_stop; fi
fi
finish "every answer 200, valid JSON events; alive; sessions readable, saved" "$obs" "$ok"

# --- 2. a crafted state folder ---------------------------------------------------------------------
begin 2
obs="" ok=0
ANSWERED=/dev/null
if srv_start --state-dir "$state"; then
  client sessions "$port" x y z keep >/dev/null
  srv_stop
fi
export ANSWERED="$meta/answered"
file_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["sessions"][sys.argv[2]])' "$state/index.json" "$1" 2>/dev/null; }
fx="$(file_of x)" fy="$(file_of y)" fz="$(file_of z)" fk="$(file_of keep)"
if [ -n "$fx" ] && [ -n "$fy" ] && [ -n "$fz" ] && [ -n "$fk" ]; then
  outside_check   # the first server's run; the copy below joins the sentinel tree
  printf '{"version":1,"sessions":{"x":"../../../../SENTINEL","y":"%s","z":"%s","keep":"%s"}}\n' "$cdir/sentinel2" "$fz" "$fk" >"$state/index.json"
  cp "$state/$fz" "$cdir/outside/z-copy.wmsess"                 # a valid session file outside, linked in
  rm "$state/$fz"; ln -s "$cdir/outside/z-copy.wmsess" "$state/$fz"
  ln -s "$cdir/outside/written-through" "$state/$fx.tmp-0123456789abcdef"   # links at temporaries' names
  ln -s "$cdir/SENTINEL" "$state/index.json.tmp-fedcba9876543210"
  ln -s "$cdir/sentinel2" "$state/$fy.tmp-00000000deadbeef"
  head -c 3000 /dev/urandom >"$state/s-0123456789abcdef.wmsess"     # garbage where a session file would be
  echo "my notes" >"$state/s-notes.txt"; echo "my temp" >"$state/foo.tmp"
  printf 'keep\t\n' >>"$ANSWERED"
  before_outside="$(outside_listing)"   # the planted tree is what must stay as it is
  user_before="$(cd "$state" && cksum s-notes.txt foo.tmp)"
  if srv_start --state-dir "$state"; then
    s2="$(client sessions "$port" x y z)"
    g2="$(client get "$port" keep x y)"
    srv_stop
    damaged="$(cd "$state" && ls | grep -c '\.damaged-')"
    ignored="$(grep -c 'the entry is ignored' "$serr")"
    rm -f "$state/index.json"
    if srv_start --state-dir "$state"; then
      g3="$(client get "$port" x y z keep)"; k3=$?
      lost_check
      srv_stop
      damaged3="$(cd "$state" && ls | grep -c '\.damaged-')"
      user_after="$(cd "$state" && cksum s-notes.txt foo.tmp 2>&1)"
      links="$(cd "$state" && find . -type l | wc -l)"
      obs="$ignored index entries ignored (the outside paths); requests x y z: $s2; $g2; $damaged quarantined (.damaged-*), $damaged3 after the next start; index removed: $g3; user files $([ "$user_before" = "$user_after" ] && echo untouched || echo CHANGED); $links links left in the folder"
      [ "$user_before" = "$user_after" ] && [ "$damaged" -ge 2 ] && [ "$damaged3" -ge "$damaged" ] &&
        [[ "$s2" == "200x3" ]] && [ "$k3" -eq 0 ] && ok=1
    fi
  fi
else
  obs="the first server saved no index naming x, y, z, keep"
fi
finish "nothing outside touched; user files untouched; garbage and links quarantined, not deleted; sessions found after the index is removed" "$obs" "$ok"

# --- 3. two servers on one folder ----------------------------------------------------------------
begin 3
obs="" ok=0
if srv_start --state-dir "$state"; then
  (cd "$root" && timeout -s KILL 20 "$serve" --port 0 --threads 1 --state-dir "$state" </dev/null >"$logs/3.second.out" 2>"$logs/3.second.err")
  rc2=$?
  [ "$rc2" -ge 128 ] && [ "$rc2" -ne 137 ] && c_crash="$c_crash second: signal $((rc2 - 128))"
  [ "$rc2" -eq 137 ] && c_notes="$c_notes; the second server ran 20 s"
  line="$(grep -m1 -F "$state" "$logs/3.second.err")"
  h1="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "127.0.0.1:$port/health")"
  srv_stop
  short="${line//$work/TMP}"
  obs="second: exit $rc2, '${short:0:160}'; the first still answers /health: $h1"
  [ "$rc2" -eq 1 ] && [ -n "$line" ] && [ "$h1" = 200 ] && ok=1
fi
finish "the second exits 1 with a line naming the folder" "$obs" "$ok"

# --- 4. chunked uploads past --max-body-bytes ------------------------------------------------------
begin 4
obs="" ok=0
if srv_start --state-dir "$state"; then
  r0="$(rss)"
  o1="$(client chunked "$port" 64 1)"; k1=$?
  r1="$(rss)"
  o2="$(client chunked "$port" 48 4)"; k2=$?
  r2="$(rss)" peak="$(hwm)"
  h1="$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "127.0.0.1:$port/health")"
  srv_stop
  obs="64 MiB: $o1; 4 x 48 MiB: $o2; VmRSS $((r0 / 1024)) -> $((r1 / 1024)) -> $((r2 / 1024)) MiB, VmHWM $((peak / 1024)) MiB; /health $h1"
  [ "$k1" -eq 0 ] && [ "$k2" -eq 0 ] && [ $((peak - r0)) -lt 32768 ] && [ "$h1" = 200 ] && ok=1
fi
finish "413; RSS bounded (peak under 32 MiB above the start)" "$obs" "$ok"

# --- 5. concurrent requests on one session past the model's positions -------------------------------
begin 5
obs="" ok=0
if srv_start --state-dir "$state" --policy full; then
  obs="$(client long "$port")" && ok=1
  srv_stop
  if srv_start --state-dir "$state" --policy full; then
    p2="$(client position "$port" long)" || ok=0
    obs="$obs; after a restart: $p2"
    lost_check
    srv_stop
  fi
fi
finish "no session position above 4096" "$obs" "$ok"

# --- 6. a disk that takes no more ----------------------------------------------------------------
begin 6
obs="" ok=0
if wrap="/usr/bin/prlimit --fsize=4096" pipe_logs=1 srv_start --state-dir "$state" --max-sessions 5; then
  o1="$(client many "$port" 1 5)"; k1=$?
  r5="$(rss)"
  o2="$(client many "$port" 6 100)"; k2=$?
  r100="$(rss)"
  inmem="$(curl -s --max-time 5 "127.0.0.1:$port/metrics" | awk '/^wm_serve_sessions_in_memory / {print $2}')"
  srv_stop
  obs="sessions 1-5: $o1; 6-100: $o2; VmRSS $((r5 / 1024)) MiB after 5, $((r100 / 1024)) MiB after 100; sessions_in_memory ${inmem:-?}"
  [ "$k1" -eq 0 ] && [ "$k2" -eq 0 ] && [ -n "$inmem" ] && [ "${inmem%.*}" -le 5 ] && [ $((r100 - r5)) -lt 32768 ] && ok=1
fi
finish "X-Session-Saved: false; RSS bounded; sessions_in_memory <= 5" "$obs" "$ok"

# --- 7. keep-alive latency -------------------------------------------------------------------------
begin 7
obs="" ok=0
if srv_start; then
  obs="$(client keepalive "$port")" && ok=1
  srv_stop
  ka_ms="$(echo "$obs" | sed -n 's/^keep-alive median \([0-9.]*\) ms.*/\1/p')"
  new_ms="$(echo "$obs" | sed -n 's/.*new connection \([0-9.]*\) ms.*/\1/p')"
fi
finish "keep-alive median within 2x of a new connection's" "$obs" "$ok"

# --- 8. slow clients ---------------------------------------------------------------------------------
begin 8
obs="" ok=0
if srv_start --http-threads 4; then
  obs="$(client slow "$port")" && ok=1
  srv_stop
fi
finish "/health answered within 1 s while 4 clients (--http-threads 4) trickle headers" "$obs" "$ok"

# --- 9. pipelining ------------------------------------------------------------------------------------
begin 9
obs="" ok=0
if srv_start; then
  obs="$(client pipeline "$port")" && ok=1
  srv_stop
fi
finish "three responses" "$obs" "$ok"

# --- 10. SIGTERM mid-generation, SIGHUP --------------------------------------------------------------
begin 10a
obs="" ok=0
if srv_start --state-dir "$state" --drain-timeout 0.2; then
  sent=TERM
  obs="$(client cut "$port" "$spid")" && ok=1
  srv_stop none
  obs="$obs; exit $src"
  if srv_start --state-dir "$state" --drain-timeout 0.2; then
    g="$(client get "$port" cut-whole cut-stream)" || ok=0
    obs="$obs; after a restart: $g"
    srv_stop
  fi
fi
finish "the cut answers: error code server_shutdown (503), never finish_reason stop; their sessions kept" "$obs" "$ok"

begin 10b
obs="" ok=0
if srv_start --state-dir "$state"; then
  sent=HUP
  obs="$(client hup "$port" "$spid")" && ok=1
  srv_stop none
  sent=TERM
  obs="$obs; exit $src"
  [ "$src" -eq 0 ] || ok=0
  if srv_start --state-dir "$state"; then lost_check; srv_stop; fi
fi
finish "SIGHUP: drains (the request finishes) and exits 0" "$obs" "$ok"

# --- 11. the minor ones ---------------------------------------------------------------------------------
begin 11
export KEY_A="key-a-$RANDOM$RANDOM" KEY_B="key-b-$RANDOM$RANDOM"
printf '# two keys\n%s\n%s\n' "$KEY_A" "$KEY_B" >"$meta/keys.txt"
ok=0 obs=""
if srv_start --state-dir "$state" --api-key-file "$meta/keys.txt" --max-body-bytes 4096; then
  minor="$(client minor "$port")"
  client ids "$port" "$meta/ids" save >/dev/null
  srv_stop
  if srv_start --state-dir "$state" --api-key-file "$meta/keys.txt" --max-body-bytes 4096; then
    idobs="$(client ids "$port" "$meta/ids" check)"; idok=$?
    lost_check
    srv_stop
  fi
  obs="servers exited ${src}"
  ok=1
fi
finish "(the server of 11a-11m: no crash, nothing outside touched, answered sessions kept)" "$obs" "$ok"
while IFS=$'\t' read -r id exp o k; do
  [ -n "$id" ] || continue
  ncases=$((ncases + 1)); [ "$k" = yes ] || bad=$((bad + 1))
  rows+=("| $id | ${exp//|/\\|} | ${o//|/\\|} | $k |")
done <<<"${minor:-}"
ncases=$((ncases + 1)); [ "${idok:-1}" -eq 0 ] || bad=$((bad + 1))
rows+=("| 11k | response ids differ across a restart | ${idobs:-no result} | $([ "${idok:-1}" -eq 0 ] && echo yes || echo NO) |")

begin 11i
(cd "$root" && timeout -s KILL 20 "$serve" --port 0 --threads 1 --default-max-tokens 300 --max-tokens-limit 100 </dev/null >"$logs/11i.out" 2>"$logs/11i.err")
rc=$?
[ "$rc" -ge 128 ] && [ "$rc" -ne 137 ] && c_crash=" signal $((rc - 128))"
line="$(head -n1 "$logs/11i.err")"
finish "--default-max-tokens 300 --max-tokens-limit 100: exits 1" "exit $rc: '${line:0:120}'" "$([ "$rc" -eq 1 ] && echo 1 || echo 0)"

begin 11l
export KEY_E="key-e-$RANDOM$RANDOM"
obs="" ok=0
if srv_env="WM_SERVE_API_KEY=$KEY_E" srv_start; then
  obs="$(client envkey "$port")" && ok=1
  srv_stop
fi
finish "API key from WM_SERVE_API_KEY: 200 with it, 401 without" "$obs" "$ok"

echo "| case | expected | observed | ok |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
echo
echo "serve_audit: $ncases cases, $crashes crashes, $touched files touched outside, $lost answered sessions lost, keep-alive median $ka_ms ms vs new connection $new_ms ms; $bad not as expected"
[ $crashes -eq 0 ] && [ $touched -eq 0 ] && [ $lost -eq 0 ] && [ $bad -eq 0 ]
