# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled scanner of NCCL_DEBUG=INFO lines (the protocol: ingest.parsers.LineParser.native_scan).

It takes the lines that carry the volume of an INFO log, each exactly as NcclParser.feed
reads it through the per-line normaliser (ingest/parsers/nccl.py is the reference; the tests
compare the two): plain ``host:pid:tid [dev] NCCL INFO <msg>`` lines whose message is a
transport edge, a ring, Trees, comm init / Init COMPLETE, threadThresholds, P2P chunk size,
channel counts, Connected..., the env lines (NCCL version, cudaDriverVersion, Bootstrap,
NET/IB, NET/Socket, NET/Plugin, Using network) or a per-call TUNING / COLL line; blank lines;
an ISO timestamp line when the line after it is one of those (their records do not use it).

Deliberately not here: anything the normaliser would change beyond trailing whitespace
(launcher prefixes, indentation, ANSI colour), WARN lines and events (they use the timestamp
and rank), non-ASCII text (Python's ``\\d``, ``\\s`` and ``\\w`` are Unicode), numbers of more
than 18 digits, and any line whose shape is not exactly one of the above: the scanner stops
before such a line and the Python path takes it. Every check happens before any state is
changed, so a refused line leaves the parser as it was.
"""
from libc.string cimport memchr

ctypedef unsigned char ucs1  # Py_UCS1, Py_UCS2, Py_UCS4
ctypedef unsigned short ucs2
ctypedef unsigned int ucs4

cdef extern from "Python.h":
    object PyUnicode_New(Py_ssize_t size, ucs4 maxchar)
    void* PyUnicode_DATA(object o)
    int PyUnicode_KIND(object o)
    bint PyUnicode_IS_ASCII(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    int PyUnicode_1BYTE_KIND
    int PyUnicode_2BYTE_KIND

ctypedef fused chr_t:  # the three kinds of str storage (PEP 393)
    ucs1
    ucs2
    ucs4

cdef enum:
    MAX_DIGITS = 18  # numbers the scanner converts itself (int() of longer ones is left to Python)

# The channel ids as NCCL prints them ("0".."9", "00".."99"), made once.
cdef tuple _CHANNELS = tuple(str(i) for i in range(10)) + tuple(f"{i:02d}" for i in range(100))


cdef class _State:
    """The parser's state the scanner updates in place (NcclParser's attributes)."""
    cdef object source
    cdef list records
    cdef dict edges, edge_channels, colls, memo
    cdef set seen_env
    cdef object transport_kind


# ------------------------------------------------------------------ character helpers

cdef inline bint _ws(unsigned int c) nogil:
    """ASCII whitespace as str.isspace / re's \\s see it: \\t\\n\\v\\f\\r, \\x1c-\\x1f, space."""
    return c == 32 or 9 <= c <= 13 or 28 <= c <= 31


cdef inline bint _digit(unsigned int c) nogil:
    return 48 <= c <= 57


cdef inline bint _alnum(unsigned int c) nogil:
    return 48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122


cdef inline bint _alpha(unsigned int c) nogil:
    return 65 <= c <= 90 or 97 <= c <= 122


cdef inline bint _hostc(unsigned int c) nogil:
    return _alnum(c) or c == 95 or c == 46 or c == 45  # [\w.\-] in ASCII


cdef inline bint _lhex(unsigned int c) nogil:
    return 48 <= c <= 57 or 97 <= c <= 102  # [0-9a-f]


cdef inline bint _hex(unsigned int c) nogil:
    return 48 <= c <= 57 or 97 <= c <= 102 or 65 <= c <= 70  # [0-9a-fA-F]


cdef inline Py_ssize_t _digits(const chr_t* s, Py_ssize_t i, Py_ssize_t b) nogil:
    """End of the run of ASCII digits at i."""
    while i < b and _digit(s[i]):
        i += 1
    return i


cdef inline Py_ssize_t _nonws(const chr_t* s, Py_ssize_t i, Py_ssize_t b) nogil:
    """End of the run of non-whitespace at i (\\S+ in ASCII)."""
    while i < b and not _ws(s[i]):
        i += 1
    return i


cdef inline bint _at(const chr_t* s, Py_ssize_t i, Py_ssize_t b, const char* lit) nogil:
    """Whether s[i:] starts with the ASCII literal lit (within b)."""
    cdef Py_ssize_t k = 0
    while lit[k]:
        if i + k >= b or s[i + k] != <ucs1>lit[k]:
            return False
        k += 1
    return True


cdef inline Py_ssize_t _find(const chr_t* s, Py_ssize_t i, Py_ssize_t b, const char* lit) nogil:
    """Index of the first ASCII literal lit in s[i:b], or -1."""
    while i < b:
        if s[i] == <ucs1>lit[0] and _at(s, i, b, lit):
            return i
        i += 1
    return -1


cdef inline long long _num(const chr_t* s, Py_ssize_t a, Py_ssize_t b) nogil:
    cdef long long v = 0
    while a < b:
        v = v * 10 + (s[a] - 48)
        a += 1
    return v


cdef str _text(const chr_t* s, Py_ssize_t a, Py_ssize_t b):
    """s[a:b] (ASCII) as a str."""
    cdef object o = PyUnicode_New(b - a, 127)
    cdef ucs1* d = <ucs1*>PyUnicode_DATA(o)
    cdef Py_ssize_t i
    for i in range(b - a):
        d[i] = <ucs1>s[a + i]
    return <str>o


cdef str _joined(ucs1 tag, const chr_t* s, Py_ssize_t a1, Py_ssize_t b1, Py_ssize_t a2, Py_ssize_t b2,
                 Py_ssize_t a3, Py_ssize_t b3):
    """tag + s[a1:b1] + s[a2:b2] + s[a3:b3] (ASCII) as one str: a line's key text in one object."""
    cdef Py_ssize_t n1 = b1 - a1, n2 = b2 - a2, n3 = b3 - a3, i
    cdef object o = PyUnicode_New(1 + n1 + n2 + n3, 127)
    cdef ucs1* d = <ucs1*>PyUnicode_DATA(o)
    d[0] = tag
    d += 1
    for i in range(n1):
        d[i] = <ucs1>s[a1 + i]
    d += n1
    for i in range(n2):
        d[i] = <ucs1>s[a2 + i]
    d += n2
    for i in range(n3):
        d[i] = <ucs1>s[a3 + i]
    return <str>o


cdef inline object _int(const chr_t* s, Py_ssize_t a, Py_ssize_t b):
    return _num(s, a, b)


cdef inline str _channel(const chr_t* s, Py_ssize_t a, Py_ssize_t b):
    if b - a == 2:
        return <str>_CHANNELS[10 + (s[a] - 48) * 10 + (s[a + 1] - 48)]
    if b - a == 1:
        return <str>_CHANNELS[s[a] - 48]
    return _text(s, a, b)


# ------------------------------------------------------------------ records

cdef dict _row(_State st, str table, Py_ssize_t lineno, str record):
    return {"table": table, "source": st.source, "line": lineno, "record": record}


cdef inline void _header(dict rec, str host, const chr_t* s, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t d0, Py_ssize_t d1):
    """NcclParser._header: host, pid and (unless the rule set it) cuda_dev."""
    rec["host"] = host
    rec["pid"] = _int(s, p0, p1)
    if "cuda_dev" not in rec:
        rec["cuda_dev"] = _int(s, d0, d1)


cdef bint _env(_State st, Py_ssize_t lineno, str record, str key, str value):
    """An env rule's record, deduplicated through seen_env (NcclParser._msg)."""
    cdef tuple k = (key, value)
    if k in st.seen_env:
        return True
    st.seen_env.add(k)
    st.records.append({"table": "env", "source": st.source, "line": lineno, "record": record, "key": key,
                       "value": value, "kind": "nccl"})
    return True


# ------------------------------------------------------------------ messages
# Each returns True when it took the line (and changed the state), False before changing anything.
# h0:h1 host, p0:p1 pid, d0:d1 dev (at most MAX_DIGITS digits each), m: the message, b: its end.

cdef bint _edge_at(const chr_t* s, Py_ssize_t k, Py_ssize_t b, Py_ssize_t* g) nogil:
    """nccl._EDGE after the channel and conn, from k: `` : src[id] [-> dst[id]] [[send]|[receive]]
    via transport``. Fills g: src 0:1, src id 2:3, dst 4:5, dst id 6:7 (0: absent), direction
    8 (0: none, 1: send, 2: receive), transport 9. Optional parts are taken greedily: where one
    starts but does not finish, the regex fails too (what could follow it starts differently),
    so this reads the regex's one parse."""
    cdef Py_ssize_t j, i
    for i in range(9):
        g[i] = 0
    if not _at(s, k, b, " : "):
        return False
    g[0] = k + 3
    g[1] = j = _digits(s, g[0], b)
    if j == g[0] or j - g[0] > MAX_DIGITS:
        return False
    if j < b and s[j] == 91:  # [src_id]
        g[2] = j = j + 1
        while j < b and _hex(s[j]):
            j += 1
        g[3] = j
        if j == g[2] or j >= b or s[j] != 93:
            return False
        j += 1
    if _at(s, j, b, " -> "):
        g[4] = j + 4
        g[5] = j = _digits(s, g[4], b)
        if j == g[4] or j - g[4] > MAX_DIGITS:
            return False
        if j < b and s[j] == 91:  # [dst_id]
            g[6] = j = j + 1
            while j < b and _hex(s[j]):
                j += 1
            g[7] = j
            if j == g[6] or j >= b or s[j] != 93:
                return False
            j += 1
    if _at(s, j, b, " [send]"):
        g[8], j = 1, j + 7
    elif _at(s, j, b, " [receive]"):
        g[8], j = 2, j + 10
    g[9] = j + 5
    return _at(s, j, b, " via ") and j + 5 < b


cdef bint _ring_at(const chr_t* s, Py_ssize_t k, Py_ssize_t b) nogil:
    """nccl._RING after ``Channel N/M``, from k: `` :`` then (whitespace, digits) repeated to the end."""
    cdef Py_ssize_t j = k + 2, i
    if not _at(s, k, b, " :") or j >= b:
        return False
    while j < b:
        i = j
        while j < b and _ws(s[j]):
            j += 1
        if j == i:
            return False
        i = j
        j = _digits(s, j, b)
        if j == i:
            return False
    return True


cdef bint _edge(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno, bint collnet,
                Py_ssize_t h0, Py_ssize_t h1, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t d0, Py_ssize_t d1) except -1:
    """``(Channel|CollNet) N[/M] : src[id] [-> dst[id]] [[send]|[receive]] via transport`` (nccl._EDGE):
    counted into its transport row (NcclParser._add_edge); else, for Channel, a ring
    ``Channel N/M : r r ...`` (nccl._RING)."""
    cdef Py_ssize_t c0 = m + 8, c1, k, n0 = 0, n1 = 0
    cdef Py_ssize_t g[10]
    cdef str composite, chan
    cdef object key, e
    cdef dict rec
    c1 = _digits(s, c0, b)
    if c1 == c0:
        return False
    k = c1
    if k < b and s[k] == 47:  # "/conn"
        n0 = k + 1
        n1 = _digits(s, n0, b)
        if n1 == n0:
            return False
        k = n1
    if _edge_at(s, k, b, g):
        chan = _channel(s, c0, c1)
        # the key (host, pid, src, dst, direction, transport) through the memo of its text
        composite = _joined(69, s, h0, p1, k, b, 0, 0)  # "E" "host:pid" " : src ... via transport"
        key = st.memo.get(composite)
        if key is None:
            key = st.memo[composite] = (
                _text(s, h0, h1), _text(s, p0, p1), _text(s, g[0], g[3] + 1 if g[2] else g[1]),
                (_text(s, g[4], g[7] + 1 if g[6] else g[5])) if g[4] else "",
                "send" if g[8] == 1 else "receive" if g[8] == 2 else "", _text(s, g[9], b))
        e = st.edges.get(key)
        if e is None:  # NcclParser._new_edge
            rec = {"table": "comm_topology", "source": st.source, "line": lineno, "record": "transport",
                   "host": (<tuple>key)[0], "pid": _int(s, p0, p1), "cuda_dev": _int(s, d0, d1),
                   "rank": _int(s, g[0], g[1]), "peer": _int(s, g[4], g[5]) if g[4] else None,
                   "rank_id": _text(s, g[2], g[3]) if g[2] else None, "peer_id": _text(s, g[6], g[7]) if g[6] else None,
                   "direction": (<tuple>key)[4] or None, "transport": (<tuple>key)[5],
                   "transport_kind": st.transport_kind((<tuple>key)[5]), "via_collnet": collnet,
                   "num_channels": 1, "channels": chan}
            st.edges[key] = rec
            st.edge_channels[key] = {chan: None}
        else:
            (<dict>e)["num_channels"] += 1
            (<dict>st.edge_channels[key])[chan] = None
        return True
    if collnet or n0 == 0 or c1 - c0 > MAX_DIGITS or n1 - n0 > MAX_DIGITS or not _ring_at(s, k, b):
        return False
    rec = {"table": "comm_topology", "source": st.source, "line": lineno, "record": "ring",
           "channel": _int(s, c0, c1), "num_channels": _int(s, n0, n1), "ring": " ".join(_text(s, k + 2, b).split())}
    _header(rec, _text(s, h0, h1), s, p0, p1, d0, d1)
    st.records.append(rec)
    return True


cdef bint _tuning(_State st, const chr_t* s, Py_ssize_t f0, Py_ssize_t f1, Py_ssize_t q, Py_ssize_t b,
                  Py_ssize_t lineno) except -1:
    """``[func: ]bytes Bytes -> Algo a proto p (time|channels) t...`` (nccl._RULES["tuning"]), counted
    into its collectives row (NcclParser._agg); f0:f1 the function (f0 == f1: none), q the bytes."""
    cdef Py_ssize_t q1, a0, a1, r0, r1, j
    cdef str composite
    cdef object key, have
    cdef dict rec
    q1 = _digits(s, q, b)
    if q1 == q or q1 - q > MAX_DIGITS or not _at(s, q1, b, " Bytes -> Algo "):
        return False
    a0 = q1 + 15
    a1 = _digits(s, a0, b)
    if a1 == a0 or a1 - a0 > MAX_DIGITS or not _at(s, a1, b, " proto "):
        return False
    r0 = a1 + 7
    r1 = _digits(s, r0, b)
    if r1 == r0 or r1 - r0 > MAX_DIGITS:
        return False
    if _at(s, r1, b, " time "):
        j = r1 + 6
    elif _at(s, r1, b, " channels "):
        j = r1 + 10
    else:
        return False
    if j >= b or not (_digit(s[j]) or s[j] == 46):  # [\d.]+
        return False
    composite = _joined(84, s, f0, r1, 0, 0, 0, 0)  # "T" "func: bytes Bytes -> Algo a proto p"
    key = st.memo.get(composite)
    if key is None:
        key = st.memo[composite] = ("tuning", _text(s, f0, f1) if f1 > f0 else None, _int(s, q, q1),
                                    _int(s, a0, a1), _int(s, r0, r1))
    have = st.colls.get(key)
    if have is not None:
        (<dict>have)["num_calls"] += 1
        return True
    rec = _row(st, "collectives", lineno, "tuning")
    if f1 > f0:
        rec["func"] = (<tuple>key)[1]
    rec["size_b"] = (<tuple>key)[2]
    rec["algo"] = (<tuple>key)[3]
    rec["proto"] = (<tuple>key)[4]
    rec["num_calls"] = 1
    st.colls[key] = rec
    return True


cdef bint _coll(_State st, const chr_t* s, Py_ssize_t f0, Py_ssize_t f1, Py_ssize_t b, Py_ssize_t lineno,
                Py_ssize_t h0, Py_ssize_t h1, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t d0, Py_ssize_t d1) except -1:
    """``func: opCount x sendbuff x recvbuff x count n datatype n op n root n comm 0x.. [[nranks=n]]...``
    (nccl._COLL), counted into its collectives row (NcclParser._coll); f0:f1 the function."""
    cdef Py_ssize_t j = f1 + 1, o0, o1, c0, n0, n1, t0, t1, r0, r1, x0, x1, m0, m1, k0, k1 = 0, end
    cdef str composite
    cdef object key, have
    cdef dict rec
    if not _at(s, j, b, " opCount "):
        return False
    o0 = j + 9
    o1 = j = o0
    while j < b and _hex(s[j]):
        j += 1
    o1 = j
    if o1 == o0 or not _at(s, j, b, " sendbuff "):
        return False
    j = _nonws(s, j + 10, b)
    if j == o1 + 10 or not _at(s, j, b, " recvbuff "):
        return False
    k0 = j + 10
    j = _nonws(s, k0, b)
    if j == k0 or not _at(s, j, b, " count "):
        return False
    c0 = j
    n0 = j + 7
    n1 = _digits(s, n0, b)
    if n1 == n0 or n1 - n0 > MAX_DIGITS or not _at(s, n1, b, " datatype "):
        return False
    t0 = n1 + 10
    t1 = _digits(s, t0, b)
    if t1 == t0 or t1 - t0 > MAX_DIGITS or not _at(s, t1, b, " op "):
        return False
    r0 = t1 + 4
    r1 = _digits(s, r0, b)
    if r1 == r0 or r1 - r0 > MAX_DIGITS or not _at(s, r1, b, " root "):
        return False
    x0 = j = r1 + 6
    if j < b and s[j] == 45:  # -?\d+
        j += 1
    x1 = _digits(s, j, b)
    if x1 == j or x1 - j > MAX_DIGITS or not _at(s, x1, b, " comm 0x"):
        return False
    m0 = x1 + 6
    j = m0 + 2
    while j < b and _lhex(s[j]):
        j += 1
    m1 = end = j
    if m1 == m0 + 2:
        return False
    if _at(s, j, b, " [nranks="):
        j = k0 = m1 + 9
        j = _digits(s, j, b)
        if j > k0 and j < b and s[j] == 93:
            if j - k0 > MAX_DIGITS:
                return False
            k1, end = j, j + 1
        else:
            k0 = 0
    else:
        k0 = 0
    if _find(s, end, b, " Bytes -> Algo ") >= 0:  # NcclParser._msg would try it as a TUNING line
        return False
    composite = _joined(67, s, h0, p1, f0, f1 + 1, c0, m1)  # "C" "host:pid" "func:" " count ... comm 0x.."
    key = st.memo.get(composite)
    if key is None:
        key = st.memo[composite] = ("coll", _text(s, h0, h1), _text(s, p0, p1), _text(s, m0, m1), _text(s, f0, f1),
                                    _text(s, n0, n1), _text(s, t0, t1), _text(s, r0, r1), _text(s, x0, x1))
    have = st.colls.get(key)
    if have is not None:
        (<dict>have)["num_calls"] += 1
        return True
    rec = {"table": "collectives", "source": st.source, "line": lineno, "record": "coll", "host": (<tuple>key)[1],
           "pid": _int(s, p0, p1), "cuda_dev": _int(s, d0, d1), "comm": (<tuple>key)[3], "func": (<tuple>key)[4],
           "count": _int(s, n0, n1), "datatype": _int(s, t0, t1), "redop": _int(s, r0, r1),
           "root": int((<tuple>key)[8]), "num_ranks": _int(s, k0, k1) if k0 else None,
           "first_op_count": int(_text(s, o0, o1), 16), "num_calls": 1}
    st.colls[key] = rec
    return True


cdef bint _comm(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno,
                Py_ssize_t h0, Py_ssize_t h1, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t d0, Py_ssize_t d1) except -1:
    """``comm 0x..`` lines: comm_init, init_complete (records), comm_other (recognised); the
    abort_complete event is left to Python."""
    cdef Py_ssize_t x0 = m + 5, x1, j
    cdef Py_ssize_t q[14]
    cdef int i
    cdef dict rec
    if not _at(s, m, b, "comm 0x"):
        return False
    j = x0 + 2
    while j < b and _lhex(s[j]):
        j += 1
    x1 = j
    if x1 == x0 + 2:
        return False
    if _at(s, x1, b, " rank "):
        q[0] = x1 + 6
        q[1] = _digits(s, q[0], b)
        if q[1] > q[0] and q[1] - q[0] <= MAX_DIGITS:
            if _at(s, q[1], b, " nRanks "):  # comm_init
                j = _fields(s, q[1], b, q, 2, (" nRanks ", " nNodes ", " localRanks ", " localRank "))
                if j >= 0:
                    rec = _row(st, "comm_topology", lineno, "comm_init")
                    rec["comm"] = _text(s, x0, x1)
                    rec["rank"] = _int(s, q[0], q[1])
                    rec["num_ranks"] = _int(s, q[2], q[3])
                    rec["num_nodes"] = _int(s, q[4], q[5])
                    rec["num_local_ranks"] = _int(s, q[6], q[7])
                    rec["local_rank"] = _int(s, q[8], q[9])
                    if _at(s, j, b, " MNNVL "):
                        q[10] = j + 7
                        q[11] = _digits(s, q[10], b)
                        if q[11] - q[10] > MAX_DIGITS:
                            return False
                        if q[11] > q[10]:
                            rec["mnnvl"] = _int(s, q[10], q[11])
                    _header(rec, _text(s, h0, h1), s, p0, p1, d0, d1)
                    st.records.append(rec)
                    return True
            elif _at(s, q[1], b, " nranks "):  # init_complete
                j = _fields(s, q[1], b, q, 2, (" nranks ", " cudaDev "))
                if j >= 0 and _init_complete(st, s, j, b, lineno, x0, x1, q, h0, h1, p0, p1, d0, d1):
                    return True
    if _find(s, m, b, "COMPLETE") >= 0:  # maybe abort_complete: an event, Python's
        return False
    return x1 < b and s[x1] == 32  # comm_other: recognised, no record


cdef Py_ssize_t _fields(const chr_t* s, Py_ssize_t j, Py_ssize_t b, Py_ssize_t* q, int at, tuple names):
    """``<name>digits`` for each of names in turn from j; the digit spans into q[at:]; the end, or -1."""
    cdef bytes name
    cdef str text
    cdef Py_ssize_t k
    for text in names:
        name = text.encode()
        if not _at(s, j, b, name):
            return -1
        k = j + len(name)
        j = _digits(s, k, b)
        if j == k or j - k > MAX_DIGITS:
            return -1
        q[at], q[at + 1] = k, j
        at += 2
    return j


cdef bint _init_complete(_State st, const chr_t* s, Py_ssize_t j, Py_ssize_t b, Py_ssize_t lineno, Py_ssize_t x0,
                         Py_ssize_t x1, Py_ssize_t* q, Py_ssize_t h0, Py_ssize_t h1, Py_ssize_t p0, Py_ssize_t p1,
                         Py_ssize_t d0, Py_ssize_t d1) except -1:
    """The rest of init_complete after ``cudaDev N``: `` nvmlDev N``, `` busId X``, `` commId 0x..``,
    `` localSize N`` (each optional, in this order), then `` - Init COMPLETE``."""
    cdef Py_ssize_t v0 = 0, v1 = 0, u0 = 0, u1 = 0, i0 = 0, i1 = 0, k
    cdef dict rec
    if _at(s, j, b, " nvmlDev "):
        v0 = j + 9
        v1 = j = _digits(s, v0, b)
        if v1 == v0 or v1 - v0 > MAX_DIGITS:
            return False
    if _at(s, j, b, " busId "):
        u0 = j = j + 7
        while j < b and _hex(s[j]):
            j += 1
        u1 = j
        if u1 == u0:
            return False
    if _at(s, j, b, " commId 0x"):
        i0 = j + 8
        j = i0 + 2
        while j < b and _lhex(s[j]):
            j += 1
        i1 = j
        if i1 == i0 + 2:
            return False
    if _at(s, j, b, " localSize "):
        k = j + 11
        j = _digits(s, k, b)
        if j == k:
            return False
    if not _at(s, j, b, " - Init COMPLETE"):
        return False
    rec = _row(st, "comm_topology", lineno, "init_complete")
    rec["comm"] = _text(s, x0, x1)
    rec["rank"] = _int(s, q[0], q[1])
    rec["num_ranks"] = _int(s, q[2], q[3])
    rec["cuda_dev"] = _int(s, q[4], q[5])
    if v0:
        rec["nvml_dev"] = _int(s, v0, v1)
    if u0:
        rec["bus_id"] = _text(s, u0, u1)
    if i0:
        rec["comm_id"] = _text(s, i0, i1)
    _header(rec, _text(s, h0, h1), s, p0, p1, d0, d1)
    st.records.append(rec)
    return True


cdef bint _channels(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno,
                    Py_ssize_t h0, Py_ssize_t h1, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t d0, Py_ssize_t d1) except -1:
    """``N coll channels, N collnet channels, ..., N p2p channels per peer`` (NcclParser._channels),
    items ``N (coll|collnet|nvls|p2p) channels`` or ``N p2p channels per peer`` joined by ``, ``
    and nothing else: the last of each kind counts (a dict), the first per-peer item."""
    cdef Py_ssize_t j = m, k
    cdef Py_ssize_t n[5]
    cdef bint comma_coll = False
    cdef int kind, i
    cdef dict rec
    for i in range(5):
        n[i] = -1
    while True:
        k = _digits(s, j, b)
        if k == j or k - j > MAX_DIGITS:
            return False
        if _at(s, k, b, " coll channels"):
            kind, i = 0, k + 14
        elif _at(s, k, b, " collnet channels"):
            kind, i = 1, k + 17
        elif _at(s, k, b, " nvls channels"):
            kind, i = 2, k + 14
        elif _at(s, k, b, " p2p channels per peer"):
            kind, i = 4, k + 22
        elif _at(s, k, b, " p2p channels"):
            kind, i = 3, k + 13
        else:
            return False
        if kind != 4 or n[4] < 0:
            n[kind] = _num(s, j, k)
        if i == b:
            break
        if not _at(s, i, b, ", "):
            return False
        if kind == 0:
            comma_coll = True
        j = i + 2
    if not comma_coll:  # NcclParser._msg only reads lines holding " coll channels, " this way
        return False
    rec = _row(st, "comm_topology", lineno, "channels")
    rec["num_coll_channels"] = n[0] if n[0] >= 0 else None
    rec["num_collnet_channels"] = n[1] if n[1] >= 0 else None
    rec["num_nvls_channels"] = n[2] if n[2] >= 0 else None
    rec["num_p2p_channels"] = n[3] if n[3] >= 0 else None
    rec["num_p2p_channels_per_peer"] = n[4] if n[4] >= 0 else None
    _header(rec, _text(s, h0, h1), s, p0, p1, d0, d1)
    st.records.append(rec)
    return True


cdef bint _rest(_State st, const chr_t* s, Py_ssize_t v, Py_ssize_t b, Py_ssize_t lineno, str record, str column,
                Py_ssize_t h0, Py_ssize_t h1, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t d0, Py_ssize_t d1) except -1:
    """``<word> (?P<x>.+)`` rules of one text column (tree, thread_thresholds): the rest of the line from v."""
    cdef dict rec
    if v >= b:
        return False
    rec = _row(st, "comm_topology", lineno, record)
    rec[column] = _text(s, v, b)
    _header(rec, _text(s, h0, h1), s, p0, p1, d0, d1)
    st.records.append(rec)
    return True


cdef bint _message(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno,
                   Py_ssize_t h0, Py_ssize_t h1, Py_ssize_t p0, Py_ssize_t p1, Py_ssize_t d0, Py_ssize_t d1) except -1:
    """NcclParser._msg's dispatch, for the messages above; False for any other."""
    cdef Py_ssize_t w = m, k, v
    cdef unsigned int c = s[m]
    cdef dict rec
    if _at(s, m, b, "Channel "):
        return _edge(st, s, m, b, lineno, False, h0, h1, p0, p1, d0, d1)
    if _at(s, m, b, "CollNet "):
        return _edge(st, s, m, b, lineno, True, h0, h1, p0, p1, d0, d1)
    while w < b and s[w] != 32:  # the first word: stripped.split(" ", 1)[0]
        w += 1
    if _digit(c):
        if _find(s, m, b, " Bytes -> ") >= 0:
            return _tuning(st, s, m, m, m, b, lineno)
        return _channels(st, s, m, b, lineno, h0, h1, p0, p1, d0, d1)
    k = m
    while k < w and _alpha(s[k]):
        k += 1
    if k > m and k + 1 == w and s[k] == 58 and w < b:  # "func: " (never a _RULES word)
        if _digit(s[w + 1]):
            return _tuning(st, s, m, k, w + 1, b, lineno)
        return _coll(st, s, m, k, b, lineno, h0, h1, p0, p1, d0, d1)
    if w == b:
        return False
    # _RULES words (the word and its space matched here)
    if _at(s, m, b, "Trees "):
        return _rest(st, s, m + 6, b, lineno, "tree", "trees", h0, h1, p0, p1, d0, d1)
    if _at(s, m, b, "threadThresholds "):
        return _rest(st, s, m + 17, b, lineno, "thread_thresholds", "thread_thresholds", h0, h1, p0, p1, d0, d1)
    if _at(s, m, b, "comm "):
        return _comm(st, s, m, b, lineno, h0, h1, p0, p1, d0, d1)
    if _at(s, m, b, "P2P "):
        if _at(s, m, b, "P2P Chunksize set to "):
            v = m + 21
            k = _digits(s, v, b)
            if k > v:
                if k - v > MAX_DIGITS:
                    return False
                rec = _row(st, "comm_topology", lineno, "p2p_chunksize")
                rec["p2p_chunk_size_b"] = _int(s, v, k)
                _header(rec, _text(s, h0, h1), s, p0, p1, d0, d1)
                st.records.append(rec)
        return True  # else p2p_other: recognised, no record
    if _at(s, m, b, "Connected "):
        v = m + 10
        return (_at(s, v, b, "all rings") or _at(s, v, b, "all trees") or _at(s, v, b, "NVLS tree")
                or _at(s, v, b, "binomial trees") or _at(s, v, b, "collnet"))
    if _at(s, m, b, "Using "):
        if _at(s, m, b, "Using network ") and m + 14 < b:
            return _env(st, lineno, "network", "nccl_network", _text(s, m + 14, b))
        return True  # nccl_using: recognised, no record
    if _at(s, m, b, "cudaDriverVersion "):
        v = m + 18
        k = _digits(s, v, b)
        return k > v and _env(st, lineno, "cuda_driver_version", "cuda_driver_version", _text(s, v, k))
    if _at(s, m, b, "NCCL version "):
        v = m + 13
        k = _nonws(s, v, b)
        return k > v and _env(st, lineno, "nccl_version", "nccl_version", _text(s, v, k))
    if _at(s, m, b, "Bootstrap : Using "):
        return m + 18 < b and _env(st, lineno, "bootstrap", "nccl_bootstrap", _text(s, m + 18, b))
    if _at(s, m, b, "NET/IB : Using "):
        return m + 15 < b and _env(st, lineno, "net_ib", "nccl_net_ib", _text(s, m + 15, b))
    if _at(s, m, b, "NET/Socket : Using "):
        return m + 19 < b and _env(st, lineno, "net_socket", "nccl_net_socket", _text(s, m + 19, b))
    if _at(s, m, b, "NET/Plugin : "):
        return m + 13 < b and _env(st, lineno, "net_plugin", "nccl_net_plugin", _text(s, m + 13, b))
    return False


# ------------------------------------------------------------------ lines

cdef bint _line(_State st, const chr_t* s, Py_ssize_t a, Py_ssize_t b, Py_ssize_t lineno) except -1:
    """A normalised line a:b (first character a letter or digit, no trailing whitespace):
    ``host:pid:tid [dev] NCCL INFO <msg>`` with a message of _message."""
    cdef Py_ssize_t i = a, h1, p0, p1, d0, d1, m
    while i < b and _hostc(s[i]):
        i += 1
    h1 = i
    if i >= b or s[i] != 58:
        return False
    p0 = i + 1
    p1 = _digits(s, p0, b)
    if p1 == p0 or p1 - p0 > MAX_DIGITS or p1 >= b or s[p1] != 58:
        return False
    i = _digits(s, p1 + 1, b)
    if i == p1 + 1 or not _at(s, i, b, " ["):
        return False
    d0 = i + 2
    d1 = _digits(s, d0, b)
    if d1 == d0 or d1 - d0 > MAX_DIGITS or not _at(s, d1, b, "] NCCL INFO "):
        return False
    m = d1 + 12
    while m < b and _ws(s[m]):  # msg.lstrip()
        m += 1
    if m >= b:
        return False
    return _message(st, s, m, b, lineno, a, h1, p0, p1, d0, d1)


cdef bint _timestamp(const chr_t* s, Py_ssize_t a, Py_ssize_t b) nogil:
    """ingest.parsers.is_timestamp_line in ASCII: _ISO_TS in full, at most 35 characters."""
    cdef Py_ssize_t i
    cdef int k
    if b - a < 19 or b - a > 35:
        return False
    for k in range(19):
        if k == 4 or k == 7:
            if s[a + k] != 45:
                return False
        elif k == 10:
            if s[a + k] != 84 and s[a + k] != 32:
                return False
        elif k == 13 or k == 16:
            if s[a + k] != 58:
                return False
        elif not _digit(s[a + k]):
            return False
    i = a + 19
    if i < b and (s[i] == 46 or s[i] == 44):  # (?:[.,]\d+)?
        if i + 1 >= b or not _digit(s[i + 1]):
            return False
        i = _digits(s, i + 1, b)
    if i < b and s[i] == 90:  # Z
        i += 1
    elif i < b and (s[i] == 43 or s[i] == 45):  # [+-]\d\d:?\d\d
        if i + 3 > b or not _digit(s[i + 1]) or not _digit(s[i + 2]):
            return False
        i += 3
        if i < b and s[i] == 58:
            i += 1
        if i + 2 > b or not _digit(s[i]) or not _digit(s[i + 1]):
            return False
        i += 2
    return i == b


cdef inline Py_ssize_t _eol(const chr_t* s, Py_ssize_t i, Py_ssize_t n) nogil:
    """Index of the next newline at or after i, or n."""
    cdef const void* p
    if chr_t is ucs1:
        p = memchr(s + i, 10, n - i)
        return n if p == NULL else <Py_ssize_t>((<const ucs1*>p) - s)
    else:
        while i < n and s[i] != 10:
            i += 1
        return i


cdef inline bint _ascii(const chr_t* s, Py_ssize_t a, Py_ssize_t b) nogil:
    while a < b:
        if s[a] >= 128:
            return False
        a += 1
    return True


cdef Py_ssize_t _resume(const chr_t* s, Py_ssize_t i, Py_ssize_t n) nogil:
    """The newline before the next line the scanner may take after the newline at i: a line
    starting with a letter or digit that holds `` NCCL INFO `` or is short (a timestamp); n if none."""
    cdef Py_ssize_t e
    while i < n:
        e = _eol(s, i + 1, n)
        if i + 1 < e and _alnum(s[i + 1]) and (e - i <= 40 or _find(s, i + 1, e, " NCCL INFO ") >= 0):
            return i
        i = e
    return n


cdef tuple _scan(_State st, const chr_t* s, Py_ssize_t n, bint ascii, Py_ssize_t pos, Py_ssize_t lineno):
    cdef Py_ssize_t last = 0, a, e = pos, b, ts_pos = -1, ts_lineno = 0, ts_last = 0
    cdef unsigned int c
    cdef bint stopped = False
    while pos < n:
        a = pos + 1
        e = _eol(s, a, n)
        b = e
        while b > a and _ws(s[b - 1]):  # line.rstrip() (a non-ASCII space stays and is refused below)
            b -= 1
        if b > a:
            if not ascii and not _ascii(s, a, b):
                stopped = True
                break
            c = s[a]
            if _digit(c) and _timestamp(s, a, b):
                # a timestamp line: taken if the next non-blank line is taken (its record does not use it)
                ts_pos, ts_lineno, ts_last = pos, lineno, last
                last = lineno + 1
            elif _alnum(c) and _line(st, s, a, b, lineno + 1):
                ts_pos = -1
                last = lineno + 1
            else:
                stopped = True
                break
        pos = e
        lineno += 1
    if ts_pos >= 0:  # a timestamp line the Python path must take (for the line after it)
        pos, lineno, last = ts_pos, ts_lineno, ts_last
    return pos, lineno, last, (_resume(s, e, n) if stopped else pos)


def scan(str text, Py_ssize_t pos, Py_ssize_t lineno, source, list records, dict edges, dict edge_channels,
         dict colls, set seen_env, dict memo, transport_kind):
    """NcclParser.native_scan (see ingest.parsers.LineParser.native_scan): takes lines of text from
    the newline at pos, updating records, edges, edge_channels, colls and seen_env in place as
    NcclParser would; memo: the scanner's own map of a line's key text to its key tuple (kept
    by the parser between calls). Returns (pos, lineno, last, resume)."""
    cdef _State st = _State.__new__(_State)
    cdef int kind = PyUnicode_KIND(text)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text)
    cdef bint ascii = PyUnicode_IS_ASCII(text)
    st.source, st.records, st.edges, st.edge_channels, st.colls = source, records, edges, edge_channels, colls
    st.seen_env, st.memo, st.transport_kind = seen_env, memo, transport_kind
    if kind == PyUnicode_1BYTE_KIND:
        return _scan(st, <const ucs1*>PyUnicode_DATA(text), n, ascii, pos, lineno)
    if kind == PyUnicode_2BYTE_KIND:
        return _scan(st, <const ucs2*>PyUnicode_DATA(text), n, False, pos, lineno)
    return _scan(st, <const ucs4*>PyUnicode_DATA(text), n, False, pos, lineno)
