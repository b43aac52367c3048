# sluice - tests/integration/batchlib.py: limit.lua's batch protocol, for
# the tests that call the script by hand (issue 11).
#
# batch_args() builds one EVALSHA of several requests the way store.c does
# (distinct keys once, distinct parameter sets once, then per request its
# limits as (ref, cost [, slot] [, ovr])); split_reply() turns the reply
# back into, per request, the older shape the tests compare: [allowed,
# (allowed_i remaining_i reset_i retry_i)*n], when marks were asked for
# [time_s, time_us, mark_i*n] after it, and with override keys the limit
# each limit applied. decide_args()/decide_reply() are the one-request
# forms. See src/store/scripts/limit.lua for the protocol.
#
# A limit is [algo, limit, window_ms, interval_us, cost, flags] as the
# older one-request call took it: flag 4 (delay) with the delay in the
# window's place, and a concurrency limit's (algo 5) slot id in the
# interval's place. Here the slot id goes per request, out of the shared
# parameter set, as store.c sends it. A calendar fixed_window has interval 1
# and a seventh element, its period starts (b0, b1, b2, b3), sent after the
# requests.

CONCURRENCY = 5
DELAY = 4
OVERRIDE = 8


def batch_args(sha, requests, mode="d", now_us=None, short=False):
    """requests: list of (keys, limits, marks) or (keys, limits, marks,
    override_keys), limits as above; override_keys: one per limit. short:
    a request without marks whose limits all cost 1 goes in store.c's short
    forms, 32 + ref (one limit) or 15 + m and the refs without costs."""
    keys, kidx, params, pidx, body = [], {}, [], {}, []

    def key_index(key):
        if key not in kidx:
            kidx[key] = len(keys)
            keys.append(key)
        return kidx[key]

    for req in requests:
        rkeys, limits, marks = req[:3]
        okeys = req[3] if len(req) > 3 else None
        sf = short and not marks and all(lim[4] == 1 for lim in limits)
        if sf and len(limits) == 1:
            body.append(("short32",))
        elif sf:
            body.append(15 + len(limits))
        else:
            body.append(-len(limits) if marks else len(limits))
        for j, (key, lim) in enumerate(zip(rkeys, limits)):
            conc = lim[0] == CONCURRENCY
            p = (lim[0], lim[1], lim[2], 0 if conc else lim[3]) + tuple(lim[6:7] and lim[6])
            if p not in pidx:
                pidx[p] = len(params)
                params.append(p)
            flags = lim[5] | (OVERRIDE if okeys else 0)
            body.append((key_index(key), p, flags))
            if not sf:
                body.append(lim[4])
            if conc:
                body.append(lim[3])
            if okeys:
                body.append(("ovr", key_index(okeys[j])))
    np_ = len(params)
    args = ["EVALSHA", sha, len(keys)] + keys + [mode, np_]
    for p in params:
        args += list(p[:4])
    args.append(len(requests))
    plus = 0
    for x in body:
        if isinstance(x, tuple) and x[0] == "short32":
            plus = 32                   # added to the ref that follows
        elif isinstance(x, tuple) and x[0] == "ovr":
            args.append(x[1] + 1)
        elif isinstance(x, tuple):
            k, p, flags = x
            args.append(plus + (k * np_ + pidx[p]) * 16 + flags)
            plus = 0
        else:
            args.append(x)
    for p in params:        # a calendar window's period starts
        args += list(p[4:])
    if now_us is not None:
        args.append(now_us)
    return args


def split_reply(reply, requests):
    ts, tus = reply[0], reply[1]
    pos, res = 2, []
    for req in requests:
        rkeys, limits, marks = req[:3]
        ovr = len(req) > 3 and req[3]
        allowed, per, mk, lims = 1, [], [], []
        for lim in limits:
            v, reset = reply[pos], reply[pos + 1]
            pos += 2
            if marks:
                mk.append(reply[pos])
                pos += 1
            wait = 0
            if lim[5] & DELAY:
                wait = reply[pos]
                pos += 1
            if ovr:
                lims.append(reply[pos])
                pos += 1
            ok = 1 if v >= 0 else 0
            per += [ok, v if ok else 0, reset, wait if ok else -v]
            if not ok and lim[5] & 3 not in (1, 3):
                allowed = 0
        r = [allowed] + per
        if marks:
            r += [ts, tus] + mk
        r += lims
        res.append(r)
    assert pos == len(reply), (pos, len(reply))
    return res


def decide_args(sha, keys, limits, mode="d", now_us=None, override_keys=None):
    """One request in the older call shape: mode "c" asks for the marks."""
    marks = mode == "c"
    req = (keys, limits, marks) + ((override_keys,) if override_keys else ())
    return batch_args(sha, [req], "d" if marks else mode, now_us)


def decide_reply(reply, keys, limits, mode="d", override_keys=None):
    req = (keys, limits, mode == "c") + ((override_keys,) if override_keys else ())
    return split_reply(reply, [req])[0]
