# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled scanner of NCCL_DEBUG=INFO lines (the protocol: ingest.parsers.LineParser.native_scan).

It takes the lines that carry the volume of an INFO log, each exactly as NcclParser.feed
reads it through the per-line normaliser (ingest/parsers/nccl.py is the reference; the tests
compare the two): plain ``host:pid:tid [dev] NCCL INFO <msg>`` lines whose message is a
transport edge, a ring, Trees, comm init / Init COMPLETE, NVLS, threadThresholds, P2P chunk
size, channel counts, Connected..., the env lines (NCCL version, cudaDriverVersion,
Bootstrap, NET/IB, NET/Socket, NET/Plugin, Using network) or a per-call TUNING / COLL line;
nccl-tests ``#`` lines; blank lines; an ISO timestamp line when the next non-blank line is one
of those (their records do not use it).

Deliberately not here: anything the normaliser would change beyond trailing whitespace
(launcher prefixes, indentation), WARN lines and events (they use the timestamp and rank),
lines no parser recognises (the Runner counts them), non-ASCII text (Python's ``\\d``,
``\\s`` and ``\\w`` are Unicode), numbers of more than 18 digits, and any line whose shape is
not exactly one of the above: the scanner stops before such a line and the Python path takes
it. Every check of a line happens before it changes any state, so a refused line leaves the
parser as it was. Each reader below names the regex or method of nccl.py it mirrors; optional
parts are read greedily, which gives the regex's one parse: where an optional part starts
but does not finish, what could follow it starts differently, so the regex fails too.
"""
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport uint64_t
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memchr, memcmp, memcpy, memset, strlen

ctypedef unsigned char ucs1  # Py_UCS1, Py_UCS2, Py_UCS4
ctypedef unsigned short ucs2
ctypedef unsigned int ucs4

cdef extern from "Python.h":
    dict _PyDict_NewPresized(Py_ssize_t minused)  # (a dict literal of <= 8 keys starts at 5 and resizes)
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
    MAX_DIGITS = 18  # numbers converted here (int() of longer ones is left to Python)
    MEMO_KEY_MAX = 240  # longest key text kept in the memo (longer lines build their key each time)
    C_DIGIT = 1
    C_ALPHA = 2
    C_HOST = 4  # [\w.\-] in ASCII
    C_HEX = 8  # [0-9a-fA-F]
    C_LHEX = 16  # [0-9a-f]
    C_WS = 32  # str.isspace / re \s in ASCII: \t\n\v\f\r, \x1c-\x1f, space

cdef unsigned char _CLS[128]


cdef void _init_classes():
    cdef int c
    for c in range(128):
        _CLS[c] = 0
        if 48 <= c <= 57:
            _CLS[c] |= C_DIGIT | C_HOST | C_HEX | C_LHEX
        if 65 <= c <= 90 or 97 <= c <= 122:
            _CLS[c] |= C_ALPHA | C_HOST
        if 97 <= c <= 102:
            _CLS[c] |= C_HEX | C_LHEX
        if 65 <= c <= 70:
            _CLS[c] |= C_HEX
        if c == 95 or c == 46 or c == 45:
            _CLS[c] |= C_HOST
        if c == 32 or 9 <= c <= 13 or 28 <= c <= 31:
            _CLS[c] |= C_WS


_init_classes()

# The channel ids as NCCL prints them ("0".."9", "00".."99"), made once.
cdef tuple _CHANNELS = tuple(str(i) for i in range(10)) + tuple(f"{i:02d}" for i in range(100))


# ------------------------------------------------------------------ the memo of keys

cdef struct _Entry:
    uint64_t hash
    Py_ssize_t off, size  # the key text: arena[off:off + size]
    PyObject* key  # the key tuple (owned)
    # Per scan call (valid while stamp is the memo's): the row and its channels dict as looked up
    # at the entry's first line in the call (borrowed: the parser's dicts hold them), the lines
    # counted into the row since (added at the end of the call), the channels known to be in it.
    Py_ssize_t stamp
    PyObject* row
    PyObject* chans
    Py_ssize_t pending
    uint64_t chan_bits[2]  # _CHANNELS indices


cdef class Memo:
    """The scanner's memo, kept by the parser between chunks: a line's key text (its bytes:
    host:pid and the message fields an edge or call row is keyed by) -> the key tuple. A pure
    function of the text, so it never goes stale; it spares making and hashing the key's
    strings for every line. Within one scan call (no other code runs meanwhile) an entry also
    holds its row, looked up at its first line, and counts its lines, added to the row at the
    end of the call: a known edge or call costs no dict operation. Copied or pickled, it
    starts empty."""
    cdef _Entry* entries
    cdef Py_ssize_t num_entries, entries_cap
    cdef Py_ssize_t* table  # entry index + 1 (0: empty), open addressing
    cdef Py_ssize_t table_cap
    cdef char* arena
    cdef Py_ssize_t arena_size, arena_cap
    cdef Py_ssize_t stamp
    cdef Py_ssize_t* touched  # entries with a count pending in this call
    cdef Py_ssize_t num_touched, touched_cap

    def __cinit__(self):
        self.entries_cap, self.table_cap, self.arena_cap, self.touched_cap = 256, 1024, 1 << 15, 256
        self.entries = <_Entry*>calloc(self.entries_cap, sizeof(_Entry))
        self.table = <Py_ssize_t*>calloc(self.table_cap, sizeof(Py_ssize_t))
        self.arena = <char*>calloc(self.arena_cap, 1)
        self.touched = <Py_ssize_t*>calloc(self.touched_cap, sizeof(Py_ssize_t))
        if self.entries == NULL or self.table == NULL or self.arena == NULL or self.touched == NULL:
            raise MemoryError()

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self.entries != NULL:
            for i in range(self.num_entries):
                Py_XDECREF(self.entries[i].key)
        free(self.entries)
        free(self.table)
        free(self.arena)
        free(self.touched)

    def __reduce__(self):
        return Memo, ()

    def __len__(self):
        return self.num_entries

    cdef inline Py_ssize_t find(self, const char* buf, Py_ssize_t n, uint64_t h) noexcept:
        """The entry of the text buf[:n] (hash h), or -1."""
        cdef Py_ssize_t i = <Py_ssize_t>(h & <uint64_t>(self.table_cap - 1)), k
        cdef _Entry* e
        while True:
            k = self.table[i]
            if k == 0:
                return -1
            e = &self.entries[k - 1]
            if e.hash == h and e.size == n and memcmp(self.arena + e.off, buf, n) == 0:
                return k - 1
            i = (i + 1) & (self.table_cap - 1)

    cdef Py_ssize_t add(self, const char* buf, Py_ssize_t n, uint64_t h, object key) except -1:
        """A new entry for the text buf[:n] (hash h, not in the memo) and its key; its index."""
        cdef Py_ssize_t i
        cdef _Entry* e
        if (self.num_entries + 1) * 2 > self.table_cap:
            self._grow_table()
        if self.num_entries == self.entries_cap:
            self.entries = <_Entry*>_grown(self.entries, &self.entries_cap, sizeof(_Entry), self.entries_cap + 1)
        if self.arena_size + n > self.arena_cap:
            self.arena = <char*>_grown(self.arena, &self.arena_cap, 1, self.arena_size + n)
        e = &self.entries[self.num_entries]
        memset(e, 0, sizeof(_Entry))
        memcpy(self.arena + self.arena_size, buf, n)
        e.hash, e.off, e.size = h, self.arena_size, n
        Py_INCREF(key)
        e.key = <PyObject*>key
        self.arena_size += n
        self.num_entries += 1
        i = <Py_ssize_t>(h & <uint64_t>(self.table_cap - 1))
        while self.table[i] != 0:
            i = (i + 1) & (self.table_cap - 1)
        self.table[i] = self.num_entries
        return self.num_entries - 1

    cdef int _grow_table(self) except -1:
        cdef Py_ssize_t cap = self.table_cap * 2, i, j
        cdef Py_ssize_t* table = <Py_ssize_t*>calloc(cap, sizeof(Py_ssize_t))
        if table == NULL:
            raise MemoryError()
        for i in range(self.num_entries):
            j = <Py_ssize_t>(self.entries[i].hash & <uint64_t>(cap - 1))
            while table[j] != 0:
                j = (j + 1) & (cap - 1)
            table[j] = i + 1
        free(self.table)
        self.table, self.table_cap = table, cap
        return 0

    cdef inline bint first(self, Py_ssize_t i) except -1:
        """Whether this is entry i's first line in this call (then its per-call part is reset
        and it is listed for the count at the end of the call)."""
        cdef _Entry* e = &self.entries[i]
        if e.stamp == self.stamp:
            return False
        e.stamp, e.row, e.chans, e.pending = self.stamp, NULL, NULL, 0
        e.chan_bits[0] = e.chan_bits[1] = 0
        if self.num_touched == self.touched_cap:
            self.touched = <Py_ssize_t*>_grown(self.touched, &self.touched_cap, sizeof(Py_ssize_t), self.touched_cap + 1)
        self.touched[self.num_touched] = i
        self.num_touched += 1
        return True

    cdef int begin(self) except -1:
        self.stamp += 1
        self.num_touched = 0
        return 0

    cdef int end(self) except -1:
        """Add the lines counted in this call to their rows (edges: num_channels; calls: num_calls)."""
        cdef Py_ssize_t i
        cdef _Entry* e
        cdef dict row
        for i in range(self.num_touched):
            e = &self.entries[self.touched[i]]
            if e.pending:
                row = <dict>e.row
                if e.chans != NULL:
                    row["num_channels"] += e.pending
                else:
                    row["num_calls"] += e.pending
                e.pending = 0
        self.num_touched = 0
        self.stamp += 1
        return 0


cdef void* _grown(void* p, Py_ssize_t* cap, size_t item, Py_ssize_t need) except NULL:
    """p (cap[0] items of item bytes) reallocated to at least need items (doubling)."""
    cdef Py_ssize_t c = cap[0]
    cdef void* q
    while c < need:
        c *= 2
    q = realloc(p, c * item)
    if q == NULL:
        raise MemoryError()
    memset(<char*>q + cap[0] * item, 0, (c - cap[0]) * item)
    cap[0] = c
    return q


cdef inline uint64_t _hash(const char* buf, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = 0x9E3779B97F4A7C15ULL ^ <uint64_t>n, w
    cdef Py_ssize_t i = 0
    while i + 8 <= n:
        memcpy(&w, buf + i, 8)
        h = (h ^ w) * 0xFF51AFD7ED558CCDULL
        h ^= h >> 29
        i += 8
    w = 0
    if i < n:
        memcpy(&w, buf + i, n - i)
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ULL
    h ^= h >> 32
    return h


cdef inline Py_ssize_t _pack(char* buf, Py_ssize_t n, const chr_t* s, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """Append s[a:b] (ASCII) to buf[:n]; the new length, or -1 past MEMO_KEY_MAX."""
    cdef Py_ssize_t i
    if n < 0 or n + b - a > MEMO_KEY_MAX:
        return -1
    if chr_t is ucs1:
        memcpy(buf + n, s + a, b - a)
    else:
        for i in range(b - a):
            buf[n + i] = <char>s[a + i]
    return n + b - a


cdef class _State:
    """The parser's state the scanner updates in place (NcclParser's attributes)."""
    cdef object source
    cdef list records
    cdef dict edges, edge_channels, colls
    cdef set seen_env
    cdef Memo memo


# ------------------------------------------------------------------ character helpers

cdef inline bint _is(unsigned int c, unsigned char cls) noexcept nogil:
    return c < 128 and (_CLS[c] & cls) != 0


cdef inline Py_ssize_t _run(const chr_t* s, Py_ssize_t i, Py_ssize_t b, unsigned char cls) noexcept nogil:
    """End of the run of characters of class cls at i."""
    while i < b and _is(s[i], cls):
        i += 1
    return i


cdef inline Py_ssize_t _nonws(const chr_t* s, Py_ssize_t i, Py_ssize_t b) noexcept nogil:
    """End of the run of non-whitespace at i (\\S+ in ASCII)."""
    while i < b and not _is(s[i], C_WS):
        i += 1
    return i


cdef inline bint _at(const chr_t* s, Py_ssize_t i, Py_ssize_t b, const char* lit) noexcept nogil:
    """Whether s[i:b] starts with the ASCII literal lit."""
    cdef Py_ssize_t n = <Py_ssize_t>strlen(lit), k
    if i + n > b:
        return False
    if chr_t is ucs1:
        return memcmp(s + i, lit, n) == 0
    else:
        for k in range(n):
            if s[i + k] != <ucs1>lit[k]:
                return False
        return True


cdef inline Py_ssize_t _field(const chr_t* s, Py_ssize_t j, Py_ssize_t b, const char* lit, Py_ssize_t* q) noexcept nogil:
    """``<lit>\d+`` at j: the digits' span into q[0:2], the end; -1 if absent, -2 if the number
    is longer than MAX_DIGITS (the regex matches: the line is Python's)."""
    cdef Py_ssize_t k
    if not _at(s, j, b, lit):
        return -1
    k = j + <Py_ssize_t>strlen(lit)
    j = _run(s, k, b, C_DIGIT)
    if j == k:
        return -1
    if j - k > MAX_DIGITS:
        return -2
    q[0], q[1] = k, j
    return j


cdef inline Py_ssize_t _find(const chr_t* s, Py_ssize_t i, Py_ssize_t b, const char* lit) noexcept nogil:
    """Index of the first ASCII literal lit in s[i:b], or -1."""
    cdef ucs1 first = <ucs1>lit[0]
    cdef const void* p
    while i < b:
        if chr_t is ucs1:
            p = memchr(s + i, first, b - i)
            if p == NULL:
                return -1
            i = <Py_ssize_t>((<const ucs1*>p) - s)
        elif s[i] != first:
            i += 1
            continue
        if _at(s, i, b, lit):
            return i
        i += 1
    return -1


cdef inline long long _num(const chr_t* s, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    cdef long long v = 0
    while a < b:
        v = v * 10 + <long long>(s[a] - 48)
        a += 1
    return v


cdef inline object _int(const chr_t* s, Py_ssize_t a, Py_ssize_t b):
    return _num(s, a, b)


cdef str _text(const chr_t* s, Py_ssize_t a, Py_ssize_t b):
    """s[a:b] (ASCII) as a str."""
    cdef object o = PyUnicode_New(b - a, 127)
    cdef ucs1* d = <ucs1*>PyUnicode_DATA(o)
    cdef Py_ssize_t i
    if chr_t is ucs1:
        memcpy(d, s + a, b - a)
    else:
        for i in range(b - a):
            d[i] = <ucs1>s[a + i]
    return <str>o


cdef inline Py_ssize_t _channel_index(const chr_t* s, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """The index of channel id s[a:b] in _CHANNELS, or -1."""
    if b - a == 1:
        return s[a] - 48
    if b - a == 2:
        return 10 + (s[a] - 48) * 10 + (s[a + 1] - 48)
    return -1


cdef str _transport_kind(const chr_t* s, Py_ssize_t v, Py_ssize_t b):
    """nccl._transport_kind of s[v:b]: 'P2P/CUMEM/read' -> 'P2P/CUMEM', 'NET/IB/0/GDRDMA' ->
    'NET/IB', 'SHM/direct/direct' -> 'SHM'. Both of its results are a prefix of the text: the
    first part (to '/'), and for P2P/NET/COLLNET (any case) the second part's first word."""
    cdef Py_ssize_t i = v, k, n
    cdef const char* names[3]
    cdef int j
    cdef bint same
    cdef unsigned int c
    names[0], names[1], names[2] = b"P2P", b"NET", b"COLLNET"
    while i < b and s[i] != 47:  # parts[0]
        i += 1
    if i < b:
        for j in range(3):
            n = <Py_ssize_t>strlen(names[j])
            if i - v == n:
                same = True
                for k in range(n):
                    c = s[v + k]
                    if 97 <= c <= 122:  # str.upper() in ASCII
                        c -= 32
                    if c != <ucs1>names[j][k]:
                        same = False
                        break
                if same:
                    k = i + 1
                    while k < b and s[k] != 47 and s[k] != 32:  # parts[1].split(" ")[0]
                        k += 1
                    return _text(s, v, k)
    k = v
    while k < i and s[k] != 32:  # parts[0].split(" ")[0]
        k += 1
    return _text(s, v, k)


# ------------------------------------------------------------------ records

cdef inline dict _record(_State st, str table, Py_ssize_t lineno, str record, Py_ssize_t num_keys):
    """A record's first keys (as apply_rule starts it), room made for num_keys."""
    cdef dict rec = _PyDict_NewPresized(num_keys)
    rec["table"] = table
    rec["source"] = st.source
    rec["line"] = lineno
    rec["record"] = record
    return rec


cdef inline int _header(dict rec, const chr_t* s, Py_ssize_t* h, bint cuda_dev=True) except -1:
    """NcclParser._header: host, pid and (unless the rule set it: cuda_dev False) cuda_dev."""
    rec["host"] = _text(s, h[0], h[1])
    rec["pid"] = _int(s, h[2], h[3])
    if cuda_dev:
        rec["cuda_dev"] = _int(s, h[4], h[5])
    return 0


cdef bint _env(_State st, const chr_t* s, Py_ssize_t v0, Py_ssize_t v1, Py_ssize_t lineno, str record, str key,
               int tag) except -1:
    """An env rule's record of value s[v0:v1] (non-empty), deduplicated through seen_env
    (NcclParser._msg); its (key, value) through the memo (tag: one letter per key)."""
    cdef char buf[MEMO_KEY_MAX]
    cdef Py_ssize_t nb, i
    cdef uint64_t hh
    cdef object k
    cdef dict rec
    if v1 <= v0:
        return False
    buf[0], buf[1] = b"V", <char>tag
    nb = _pack(buf, 2, s, v0, v1)
    if nb < 0:
        k = (key, _text(s, v0, v1))
    else:
        hh = _hash(buf, nb)
        i = st.memo.find(buf, nb, hh)
        if i < 0:
            i = st.memo.add(buf, nb, hh, (key, _text(s, v0, v1)))
        k = <object>st.memo.entries[i].key
    if k in st.seen_env:
        return True
    st.seen_env.add(k)
    rec = _record(st, "env", lineno, record, 7)
    rec["key"] = key
    rec["value"] = (<tuple>k)[1]
    rec["kind"] = "nccl"
    st.records.append(rec)
    return True


# ------------------------------------------------------------------ messages
# Each returns True when it took the line (and changed the state), False before changing anything.
# h: the header's spans (host h[0]:h[1], pid h[2]:h[3], dev h[4]:h[5], at most MAX_DIGITS digits
# each), m: the message (after "NCCL INFO " and its lstrip), b: its end.

cdef bint _edge_at(const chr_t* s, Py_ssize_t k, Py_ssize_t b, Py_ssize_t* g) noexcept nogil:
    """nccl._EDGE after the channel and conn, from k: `` : src[id] [-> dst[id]] [[send]|[receive]]
    via transport``. Fills g: src 0:1, src id 2:3, dst 4:5, dst id 6:7 (0: absent), direction
    8 (0: none, 1: send, 2: receive), transport 9 (to b)."""
    cdef Py_ssize_t j, i
    for i in range(10):
        g[i] = 0
    if not _at(s, k, b, " : "):
        return False
    g[0] = k + 3
    g[1] = j = _run(s, g[0], b, C_DIGIT)
    if j == g[0] or j - g[0] > MAX_DIGITS:
        return False
    if j < b and s[j] == 91:  # [src_id]
        g[2] = j + 1
        g[3] = j = _run(s, j + 1, b, C_HEX)
        if j == g[2] or j >= b or s[j] != 93:
            return False
        j += 1
    if _at(s, j, b, " -> "):
        g[4] = j + 4
        g[5] = j = _run(s, g[4], b, C_DIGIT)
        if j == g[4] or j - g[4] > MAX_DIGITS:
            return False
        if j < b and s[j] == 91:  # [dst_id]
            g[6] = j + 1
            g[7] = j = _run(s, j + 1, b, C_HEX)
            if j == g[6] or j >= b or s[j] != 93:
                return False
            j += 1
    if _at(s, j, b, " [send]"):
        g[8], j = 1, j + 7
    elif _at(s, j, b, " [receive]"):
        g[8], j = 2, j + 10
    g[9] = j + 5
    return _at(s, j, b, " via ") and j + 5 < b


cdef bint _ring_at(const chr_t* s, Py_ssize_t k, Py_ssize_t b) noexcept nogil:
    """nccl._RING after ``Channel N/M``, from k: `` :`` then (whitespace, digits) repeated to the end."""
    cdef Py_ssize_t j = k + 2, i
    if not _at(s, k, b, " :") or j >= b:
        return False
    while j < b:
        i = j
        j = _run(s, j, b, C_WS)
        if j == i:
            return False
        i = j
        j = _run(s, j, b, C_DIGIT)
        if j == i:
            return False
    return True


cdef str _ring_text(const chr_t* s, Py_ssize_t j, Py_ssize_t b):
    """" ".join(s[j:b].split()) for a ring (runs of whitespace and digits)."""
    cdef Py_ssize_t n = 0, i = j, k
    cdef object o
    cdef ucs1* d
    while i < b:  # the length: the digits and one space between numbers
        if _is(s[i], C_DIGIT):
            n += 1
        elif n and i + 1 < b and _is(s[i + 1], C_DIGIT):
            n += 1
        i += 1
    o = PyUnicode_New(n, 127)
    d = <ucs1*>PyUnicode_DATA(o)
    k = 0
    i = j
    while i < b:
        if _is(s[i], C_DIGIT):
            d[k] = <ucs1>s[i]
            k += 1
        elif k and i + 1 < b and _is(s[i + 1], C_DIGIT):
            d[k] = 32
            k += 1
        i += 1
    return <str>o


cdef tuple _edge_key(const chr_t* s, Py_ssize_t* h, Py_ssize_t* g, Py_ssize_t b):
    """NcclParser._edge's key: (host, pid, src, dst, direction, transport), src and dst with their [id]."""
    return (_text(s, h[0], h[1]), _text(s, h[2], h[3]), _text(s, g[0], g[3] + 1 if g[2] else g[1]),
            (_text(s, g[4], g[7] + 1 if g[6] else g[5])) if g[4] else "",
            "send" if g[8] == 1 else "receive" if g[8] == 2 else "", _text(s, g[9], b))


cdef dict _new_edge(_State st, const chr_t* s, Py_ssize_t* h, Py_ssize_t* g, Py_ssize_t b, tuple key, bint collnet,
                    Py_ssize_t lineno, str chan, dict chans):
    """NcclParser._new_edge: the transport row of key, and its channels (chans, holding chan)."""
    cdef dict rec = _record(st, "comm_topology", lineno, "transport", 17)
    rec["host"] = key[0]
    rec["pid"] = _int(s, h[2], h[3])
    rec["cuda_dev"] = _int(s, h[4], h[5])
    rec["rank"] = _int(s, g[0], g[1])
    rec["peer"] = _int(s, g[4], g[5]) if g[4] else None
    rec["rank_id"] = _text(s, g[2], g[3]) if g[2] else None
    rec["peer_id"] = _text(s, g[6], g[7]) if g[6] else None
    rec["direction"] = key[4] or None
    rec["transport"] = key[5]
    rec["transport_kind"] = _transport_kind(s, g[9], b)
    rec["via_collnet"] = collnet
    rec["num_channels"] = 1
    rec["channels"] = chan
    st.edges[key] = rec
    st.edge_channels[key] = chans
    return rec


cdef bint _edge(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno, bint collnet,
                Py_ssize_t* h) except -1:
    """``(Channel|CollNet) N[/M] : src[id] [-> dst[id]] [[send]|[receive]] via transport`` (nccl._EDGE):
    counted into its transport row (NcclParser._add_edge); else, for Channel, a ring
    ``Channel N/M : r r ...`` (nccl._RING)."""
    cdef Py_ssize_t c0 = m + 8, c1, k, n0 = 0, n1 = 0, nb, i, ci
    cdef Py_ssize_t g[10]
    cdef char buf[MEMO_KEY_MAX]
    cdef uint64_t hh, bit
    cdef _Entry* ent
    cdef Memo memo = st.memo
    cdef str chan
    cdef object key, e
    cdef dict rec, chans
    c1 = _run(s, c0, b, C_DIGIT)
    if c1 == c0:
        return False
    k = c1
    if k < b and s[k] == 47:  # "/conn"
        n0 = k + 1
        n1 = _run(s, n0, b, C_DIGIT)
        if n1 == n0:
            return False
        k = n1
    if _edge_at(s, k, b, g):
        ci = _channel_index(s, c0, c1)
        chan = <str>_CHANNELS[ci] if ci >= 0 else _text(s, c0, c1)
        buf[0] = b"E"
        nb = _pack(buf, _pack(buf, 1, s, h[0], h[3]), s, k, b)  # "host:pid" " : src ... via transport"
        if nb < 0:  # too long for the memo: the key and rows through the dicts
            key = _edge_key(s, h, g, b)
            e = st.edges.get(key)
            if e is None:
                _new_edge(st, s, h, g, b, key, collnet, lineno, chan, {chan: None})
            else:
                (<dict>e)["num_channels"] += 1
                (<dict>st.edge_channels[key])[chan] = None
            return True
        hh = _hash(buf, nb)
        i = memo.find(buf, nb, hh)
        if i < 0:
            i = memo.add(buf, nb, hh, _edge_key(s, h, g, b))
        if memo.first(i):  # the edge's first line in this call: its row, if any
            ent = &memo.entries[i]
            e = st.edges.get(<object>ent.key)
            if e is not None:
                chans = st.edge_channels[<object>ent.key]
                ent.row, ent.chans = <PyObject*>e, <PyObject*>chans
        ent = &memo.entries[i]
        bit = (<uint64_t>1) << (ci & 63)
        if ent.row == NULL:
            chans = {chan: None}
            rec = _new_edge(st, s, h, g, b, <tuple>ent.key, collnet, lineno, chan, chans)
            ent.row, ent.chans = <PyObject*>rec, <PyObject*>chans
        else:
            ent.pending += 1  # num_channels, added at the end of the call
            if ci < 0 or not (ent.chan_bits[ci >> 6] & bit):
                (<dict>ent.chans)[chan] = None
        if ci >= 0:
            ent.chan_bits[ci >> 6] |= bit
        return True
    if collnet or n0 == 0 or c1 - c0 > MAX_DIGITS or n1 - n0 > MAX_DIGITS or not _ring_at(s, k, b):
        return False
    rec = _record(st, "comm_topology", lineno, "ring", 10)
    rec["channel"] = _int(s, c0, c1)
    rec["num_channels"] = _int(s, n0, n1)
    rec["ring"] = _ring_text(s, k + 2, b)
    _header(rec, s, h)
    st.records.append(rec)
    return True


cdef bint _counted(_State st, Py_ssize_t i, object key) except -1:
    """A call of a known shape (NcclParser._agg / _coll: ``have["num_calls"] += 1``) through memo
    entry i (-1: none), added at the end of the call; False if the shape is new (no change)."""
    cdef _Entry* ent
    cdef object have
    if i < 0:
        have = st.colls.get(key)
        if have is None:
            return False
        (<dict>have)["num_calls"] += 1
        return True
    if st.memo.first(i):  # its first line in this call: its row, if any
        have = st.colls.get(key)
        if have is not None:
            st.memo.entries[i].row = <PyObject*>have
    ent = &st.memo.entries[i]
    if ent.row == NULL:
        return False
    ent.pending += 1
    return True


cdef dict _ALGO_IDS = None, _PROTO_IDS = None  # nccl.ALGO_IDS / PROTO_IDS, taken at first use (nccl imports this module)


cdef inline Py_ssize_t _name_run(const chr_t* s, Py_ssize_t i, Py_ssize_t b, unsigned int other) noexcept nogil:
    """End of ``[A-Z][A-Z<other>]*`` from i (i itself: none)."""
    if i >= b or not 65 <= s[i] <= 90:
        return i
    i += 1
    while i < b and (65 <= s[i] <= 90 or (other == 95 and s[i] == 95) or (other == 48 and 48 <= s[i] <= 57)):
        i += 1
    return i


cdef tuple _tuning_key(const chr_t* s, Py_ssize_t f0, Py_ssize_t f1, Py_ssize_t q, Py_ssize_t q1, Py_ssize_t a0,
                       Py_ssize_t a1, Py_ssize_t r0, Py_ssize_t r1, bint named):
    """NcclParser's collectives key of a TUNING line: ids as ints, 2.28's names as text (nccl._named_key)."""
    return ("tuning", _text(s, f0, f1) if f1 > f0 else None, _int(s, q, q1),
            _text(s, a0, a1) if named else _int(s, a0, a1), _text(s, r0, r1) if named else _int(s, r0, r1))


cdef bint _tuning(_State st, const chr_t* s, Py_ssize_t f0, Py_ssize_t f1, Py_ssize_t q, Py_ssize_t b,
                  Py_ssize_t lineno) except -1:
    """A TUNING line, counted into its collectives row (NcclParser._agg); f0:f1 the function
    (f0 == f1: none), q the bytes. Two forms (nccl._RULES["tuning"]): ``[func: ]bytes Bytes ->
    Algo a proto p (time|channels) t...`` (ids), and NCCL 2.28's ``[func: ]bytes Bytes -> Algo
    NAME proto NAME channel{Lo..Hi}={lo..hi}`` ("tuning_named", which ends the line: the ids
    from nccl.ALGO_IDS / PROTO_IDS beside the names)."""
    global _ALGO_IDS, _PROTO_IDS
    cdef Py_ssize_t q1, a0, a1, r0, r1, j, nb, i, l0 = 0, l1 = 0, h0 = 0, h1 = 0
    cdef char buf[MEMO_KEY_MAX]
    cdef uint64_t hh
    cdef object key
    cdef dict rec
    cdef bint named
    q1 = _run(s, q, b, C_DIGIT)
    if q1 == q or q1 - q > MAX_DIGITS or not _at(s, q1, b, " Bytes -> Algo "):
        return False
    a0 = q1 + 15
    named = a0 < b and 65 <= s[a0] <= 90
    if named:
        a1 = _name_run(s, a0, b, 95)  # [A-Z][A-Z_]*
        if not _at(s, a1, b, " proto "):
            return False
        r0 = a1 + 7
        r1 = _name_run(s, r0, b, 48)  # [A-Z][A-Z0-9]*
        if r1 == r0 or not _at(s, r1, b, " channel{Lo..Hi}={"):
            return False
        l0 = r1 + 18
        l1 = _run(s, l0, b, C_DIGIT)
        if l1 == l0 or l1 - l0 > MAX_DIGITS or not _at(s, l1, b, ".."):
            return False
        h0 = l1 + 2
        h1 = _run(s, h0, b, C_DIGIT)
        if h1 == h0 or h1 - h0 > MAX_DIGITS or h1 + 1 != b or s[h1] != 125:  # "}" ends the line
            return False
    else:
        a1 = _run(s, a0, b, C_DIGIT)
        if a1 == a0 or a1 - a0 > MAX_DIGITS or not _at(s, a1, b, " proto "):
            return False
        r0 = a1 + 7
        r1 = _run(s, r0, b, C_DIGIT)
        if r1 == r0 or r1 - r0 > MAX_DIGITS:
            return False
        if _at(s, r1, b, " time "):
            j = r1 + 6
        elif _at(s, r1, b, " channels "):
            j = r1 + 10
        else:
            return False
        if j >= b or not (_is(s[j], C_DIGIT) or s[j] == 46):  # [\d.]+
            return False
    buf[0] = b"N" if named else b"T"
    nb = _pack(buf, 1, s, f0, r1)  # "func: bytes Bytes -> Algo a proto p"
    if nb < 0:
        key = _tuning_key(s, f0, f1, q, q1, a0, a1, r0, r1, named)
        i = -1
    else:
        hh = _hash(buf, nb)
        i = st.memo.find(buf, nb, hh)
        if i < 0:
            i = st.memo.add(buf, nb, hh, _tuning_key(s, f0, f1, q, q1, a0, a1, r0, r1, named))
        key = <object>st.memo.entries[i].key
    if _counted(st, i, key):
        return True
    rec = _record(st, "collectives", lineno, "tuning_named" if named else "tuning", 13 if named else 9)
    if f1 > f0:
        rec["func"] = (<tuple>key)[1]
    rec["size_b"] = (<tuple>key)[2]
    if named:
        if _ALGO_IDS is None:
            from ingest.parsers.nccl import ALGO_IDS, PROTO_IDS
            _ALGO_IDS, _PROTO_IDS = ALGO_IDS, PROTO_IDS
        rec["algo_name"] = (<tuple>key)[3]
        rec["proto_name"] = (<tuple>key)[4]
        rec["channel_lo"] = _int(s, l0, l1)
        rec["channel_hi"] = _int(s, h0, h1)
        rec["algo"] = _ALGO_IDS.get((<tuple>key)[3])
        rec["proto"] = _PROTO_IDS.get((<tuple>key)[4])
    else:
        rec["algo"] = (<tuple>key)[3]
        rec["proto"] = (<tuple>key)[4]
    rec["num_calls"] = 1
    st.colls[key] = rec
    if i >= 0:
        st.memo.entries[i].row = <PyObject*>rec
    return True


cdef bint _coll(_State st, const chr_t* s, Py_ssize_t f0, Py_ssize_t f1, Py_ssize_t b, Py_ssize_t lineno,
                Py_ssize_t* h) except -1:
    """``func: opCount x sendbuff x recvbuff x count n datatype n op n root n comm 0x.. [[nranks=n]]...``
    (nccl._COLL), counted into its collectives row (NcclParser._coll); f0:f1 the function."""
    cdef Py_ssize_t j = f1 + 1, o0, o1, c0, k0, x0, m0, m1, end, nb, i
    cdef Py_ssize_t n[2]
    cdef Py_ssize_t t[2]
    cdef Py_ssize_t r[2]
    cdef Py_ssize_t x[2]
    cdef Py_ssize_t u[2]
    cdef char buf[MEMO_KEY_MAX]
    cdef uint64_t hh
    cdef object key
    cdef dict rec
    if not _at(s, j, b, " opCount "):
        return False
    o0 = j + 9
    o1 = _run(s, o0, b, C_HEX)
    if o1 == o0 or not _at(s, o1, b, " sendbuff "):
        return False
    j = _nonws(s, o1 + 10, b)
    if j == o1 + 10 or not _at(s, j, b, " recvbuff "):
        return False
    k0 = j + 10
    j = _nonws(s, k0, b)
    if j == k0:
        return False
    c0 = j
    j = _field(s, j, b, b" count ", n)
    if j >= 0:
        j = _field(s, j, b, b" datatype ", t)
    if j >= 0:
        j = _field(s, j, b, b" op ", r)
    if j < 0 or not _at(s, j, b, " root "):
        return False
    x0 = j + 6
    j = x0 + (x0 < b and s[x0] == 45)  # -?\d+
    x[0], x[1] = x0, _run(s, j, b, C_DIGIT)
    if x[1] == j or x[1] - j > MAX_DIGITS or not _at(s, x[1], b, " comm 0x"):
        return False
    m0 = x[1] + 6
    m1 = _run(s, m0 + 2, b, C_LHEX)
    if m1 == m0 + 2:
        return False
    end = m1
    u[0] = u[1] = 0
    j = _field(s, m1, b, b" [nranks=", u)
    if j == -2:
        return False
    if j >= 0 and j < b and s[j] == 93:
        end = j + 1
    else:
        u[0] = 0  # (?: \[nranks=(\d+)\])? not there
    if _find(s, end, b, " Bytes -> Algo ") >= 0:  # NcclParser._msg would try it as a TUNING line
        return False
    buf[0] = b"C"
    nb = _pack(buf, _pack(buf, _pack(buf, 1, s, h[0], h[3]), s, f0, f1 + 1), s, c0, m1)
    if nb < 0:  # "host:pid" "func:" " count ... comm 0x.."
        key = ("coll", _text(s, h[0], h[1]), _text(s, h[2], h[3]), _text(s, m0, m1), _text(s, f0, f1),
               _text(s, n[0], n[1]), _text(s, t[0], t[1]), _text(s, r[0], r[1]), _text(s, x[0], x[1]))
        i = -1
    else:
        hh = _hash(buf, nb)
        i = st.memo.find(buf, nb, hh)
        if i < 0:
            i = st.memo.add(buf, nb, hh, (
                "coll", _text(s, h[0], h[1]), _text(s, h[2], h[3]), _text(s, m0, m1), _text(s, f0, f1),
                _text(s, n[0], n[1]), _text(s, t[0], t[1]), _text(s, r[0], r[1]), _text(s, x[0], x[1])))
        key = <object>st.memo.entries[i].key
    if _counted(st, i, key):
        return True
    rec = _record(st, "collectives", lineno, "coll", 16)
    rec["host"] = (<tuple>key)[1]
    rec["pid"] = _int(s, h[2], h[3])
    rec["cuda_dev"] = _int(s, h[4], h[5])
    rec["comm"] = (<tuple>key)[3]
    rec["func"] = (<tuple>key)[4]
    rec["count"] = _int(s, n[0], n[1])
    rec["datatype"] = _int(s, t[0], t[1])
    rec["redop"] = _int(s, r[0], r[1])
    rec["root"] = -_num(s, x[0] + 1, x[1]) if s[x[0]] == 45 else _num(s, x[0], x[1])
    rec["num_ranks"] = _int(s, u[0], u[1]) if u[0] else None
    rec["first_op_count"] = int(_text(s, o0, o1), 16)
    rec["num_calls"] = 1
    st.colls[key] = rec
    if i >= 0:
        st.memo.entries[i].row = <PyObject*>rec
    return True


cdef bint _comm(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno, Py_ssize_t* h) except -1:
    """``comm 0x..`` lines: comm_init, init_complete (records), comm_other (recognised, no record);
    the abort_complete event is left to Python."""
    cdef Py_ssize_t x0 = m + 5, x1, j, k
    cdef Py_ssize_t q[16]
    cdef dict rec
    x1 = _run(s, x0 + 2, b, C_LHEX)
    if not _at(s, m, b, "comm 0x") or x1 == x0 + 2:
        return False
    j = _field(s, x1, b, b" rank ", q)
    if j >= 0 and _at(s, j, b, " nRanks "):  # comm_init
        j = _field(s, j, b, b" nRanks ", q + 2)
        if j >= 0:
            j = _field(s, j, b, b" nNodes ", q + 4)
        if j >= 0:
            j = _field(s, j, b, b" localRanks ", q + 6)
        if j >= 0:
            j = _field(s, j, b, b" localRank ", q + 8)
        if j >= 0:
            q[10] = 0
            k = _field(s, j, b, b" MNNVL ", q + 10)  # (?: MNNVL (\d+))?
            if k == -2:
                return False
            if k == -1:
                q[10] = 0
            rec = _record(st, "comm_topology", lineno, "comm_init", 14)
            rec["comm"] = _text(s, x0, x1)
            rec["rank"] = _int(s, q[0], q[1])
            rec["num_ranks"] = _int(s, q[2], q[3])
            rec["num_nodes"] = _int(s, q[4], q[5])
            rec["num_local_ranks"] = _int(s, q[6], q[7])
            rec["local_rank"] = _int(s, q[8], q[9])
            if q[10]:
                rec["mnnvl"] = _int(s, q[10], q[11])
            _header(rec, s, h)
            st.records.append(rec)
            return True
    elif j >= 0 and _at(s, j, b, " nranks "):  # init_complete
        j = _field(s, j, b, b" nranks ", q + 2)
        if j >= 0:
            j = _field(s, j, b, b" cudaDev ", q + 4)
        if j >= 0 and _init_complete(st, s, j, b, lineno, x0, x1, q, h):
            return True
    if j == -2:  # a number too long for here, where a rule may match: Python's
        return False
    if _find(s, m, b, "COMPLETE") >= 0:  # maybe abort_complete: an event, Python's
        return False
    return x1 < b and s[x1] == 32  # comm_other: recognised, no record


cdef bint _init_complete(_State st, const chr_t* s, Py_ssize_t j, Py_ssize_t b, Py_ssize_t lineno, Py_ssize_t x0,
                         Py_ssize_t x1, Py_ssize_t* q, Py_ssize_t* h) except -1:
    """The rest of init_complete after ``cudaDev N``: `` nvmlDev N``, `` busId X``, `` commId 0x..``,
    `` localSize N`` (each optional, in this order), then `` - Init COMPLETE``."""
    cdef Py_ssize_t v0 = 0, v1 = 0, u0 = 0, u1 = 0, i0 = 0, i1 = 0, k
    cdef dict rec
    if _at(s, j, b, " nvmlDev "):
        v0 = j + 9
        v1 = j = _run(s, v0, b, C_DIGIT)
        if v1 == v0 or v1 - v0 > MAX_DIGITS:
            return False
    if _at(s, j, b, " busId "):
        u0 = j + 7
        u1 = j = _run(s, u0, b, C_HEX)
        if u1 == u0:
            return False
    if _at(s, j, b, " commId 0x"):
        i0 = j + 8
        i1 = j = _run(s, i0 + 2, b, C_LHEX)
        if i1 == i0 + 2:
            return False
    if _at(s, j, b, " localSize "):
        k = j + 11
        j = _run(s, k, b, C_DIGIT)
        if j == k:
            return False
    if not _at(s, j, b, " - Init COMPLETE"):
        return False
    rec = _record(st, "comm_topology", lineno, "init_complete", 13)
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
    _header(rec, s, h, False)
    st.records.append(rec)
    return True


cdef bint _nvls(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno, Py_ssize_t* h) except -1:
    """``NVLS comm 0x.. headRank N nHeads N buffSize N[ memSize N][ nvlsPerRankSize N][ nvlsTotalSize N]``
    (nccl._RULES["NVLS"]: nvls), else ``NVLS ...`` (nvls_other: recognised, no record)."""
    cdef Py_ssize_t x0 = m + 10, x1, j, k
    cdef Py_ssize_t q[12]
    cdef const char* names[3]
    cdef int i
    cdef dict rec
    names[0], names[1], names[2] = b" memSize ", b" nvlsPerRankSize ", b" nvlsTotalSize "
    if not _at(s, m, b, "NVLS comm 0x"):
        return True  # nvls_other
    x1 = _run(s, x0 + 2, b, C_LHEX)
    if x1 == x0 + 2 or not _at(s, x1, b, " headRank "):
        return True
    k = x1 + 10
    j = k + (k < b and s[k] == 45)  # -?\d+
    q[0], q[1] = k, _run(s, j, b, C_DIGIT)
    if q[1] == j:
        return True
    if q[1] - j > MAX_DIGITS:
        return False
    j = _field(s, q[1], b, b" nHeads ", q + 2)
    if j >= 0:
        j = _field(s, j, b, b" buffSize ", q + 4)
    if j < 0:
        return j == -1  # no match: nvls_other; a number too long for here: Python's
    for i in range(3):  # (?: memSize (\d+))?(?: nvlsPerRankSize (\d+))?(?: nvlsTotalSize (\d+))?
        q[6 + 2 * i] = 0
        k = _field(s, j, b, names[i], q + 6 + 2 * i)
        if k == -2:
            return False
        if k >= 0:
            j = k
        else:
            q[6 + 2 * i] = 0
    rec = _record(st, "comm_topology", lineno, "nvls", 14)
    rec["comm"] = _text(s, x0, x1)
    rec["nvls_head_rank"] = -_num(s, q[0] + 1, q[1]) if s[q[0]] == 45 else _num(s, q[0], q[1])
    rec["nvls_num_heads"] = _int(s, q[2], q[3])
    rec["nvls_buff_size_b"] = _int(s, q[4], q[5])
    if q[6]:
        rec["nvls_mem_size_b"] = _int(s, q[6], q[7])
    if q[8]:
        rec["nvls_per_rank_size_b"] = _int(s, q[8], q[9])
    if q[10]:
        rec["nvls_total_size_b"] = _int(s, q[10], q[11])
    _header(rec, s, h)
    st.records.append(rec)
    return True


cdef bint _channels(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno,
                    Py_ssize_t* h) except -1:
    """``N coll channels, N collnet channels, ..., N p2p channels per peer`` (NcclParser._channels),
    items ``N (coll|collnet|nvls|p2p) channels`` or ``N p2p channels per peer`` joined by ``, ``
    and nothing else: the last of each kind counts (a dict), the first per-peer item."""
    cdef Py_ssize_t j = m, k, i
    cdef long long n[5]
    cdef bint comma_coll = False
    cdef int kind
    cdef dict rec
    for kind in range(5):
        n[kind] = -1
    while True:
        k = _run(s, j, b, C_DIGIT)
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
    if not comma_coll:  # NcclParser._msg reads only lines holding " coll channels, " this way
        return False
    rec = _record(st, "comm_topology", lineno, "channels", 12)
    rec["num_coll_channels"] = n[0] if n[0] >= 0 else None
    rec["num_collnet_channels"] = n[1] if n[1] >= 0 else None
    rec["num_nvls_channels"] = n[2] if n[2] >= 0 else None
    rec["num_p2p_channels"] = n[3] if n[3] >= 0 else None
    rec["num_p2p_channels_per_peer"] = n[4] if n[4] >= 0 else None
    _header(rec, s, h)
    st.records.append(rec)
    return True


cdef bint _rest(_State st, const chr_t* s, Py_ssize_t v, Py_ssize_t b, Py_ssize_t lineno, str record, str column,
                Py_ssize_t* h) except -1:
    """``<word> (?P<x>.+)`` rules of one text column (tree, thread_thresholds): the rest of the line from v."""
    cdef dict rec
    if v >= b:
        return False
    rec = _record(st, "comm_topology", lineno, record, 8)
    rec[column] = _text(s, v, b)
    _header(rec, s, h)
    st.records.append(rec)
    return True


cdef bint _message(_State st, const chr_t* s, Py_ssize_t m, Py_ssize_t b, Py_ssize_t lineno, Py_ssize_t* h) except -1:
    """NcclParser._msg's dispatch, for the messages above; False for any other. The _RULES words
    are matched with the space after them (the word is stripped.split(" ", 1)[0])."""
    cdef Py_ssize_t w, k, v
    cdef unsigned int c = s[m]
    cdef dict rec
    if c == 67:  # C
        if _at(s, m, b, "Channel "):
            return _edge(st, s, m, b, lineno, False, h)
        if _at(s, m, b, "CollNet "):
            return _edge(st, s, m, b, lineno, True, h)
        if _at(s, m, b, "Connected "):
            v = m + 10
            return (_at(s, v, b, "all rings") or _at(s, v, b, "all trees") or _at(s, v, b, "NVLS tree")
                    or _at(s, v, b, "binomial trees") or _at(s, v, b, "collnet"))
    elif c == 84:  # T
        if _at(s, m, b, "Trees "):
            return _rest(st, s, m + 6, b, lineno, "tree", "trees", h)
    elif c == 116:  # t
        if _at(s, m, b, "threadThresholds "):
            return _rest(st, s, m + 17, b, lineno, "thread_thresholds", "thread_thresholds", h)
    elif c == 99:  # c
        if _at(s, m, b, "comm "):
            return _comm(st, s, m, b, lineno, h)
        if _at(s, m, b, "cudaDriverVersion "):
            v = m + 18
            k = _run(s, v, b, C_DIGIT)
            return _env(st, s, v, k, lineno, "cuda_driver_version", "cuda_driver_version", 99)
    elif c == 80:  # P
        if _at(s, m, b, "P2P "):
            if _at(s, m, b, "P2P Chunksize set to "):
                v = m + 21
                k = _run(s, v, b, C_DIGIT)
                if k > v:
                    if k - v > MAX_DIGITS:
                        return False
                    rec = _record(st, "comm_topology", lineno, "p2p_chunksize", 8)
                    rec["p2p_chunk_size_b"] = _int(s, v, k)
                    _header(rec, s, h)
                    st.records.append(rec)
            return True  # else p2p_other: recognised, no record
    elif c == 85:  # U
        if _at(s, m, b, "Using "):
            if _at(s, m, b, "Using network ") and m + 14 < b:
                return _env(st, s, m + 14, b, lineno, "network", "nccl_network", 110)
            return True  # nccl_using: recognised, no record
    elif c == 78:  # N
        if _at(s, m, b, "NCCL "):
            v = m + 13
            k = _nonws(s, v, b)
            return _at(s, m, b, "NCCL version ") and _env(st, s, v, k, lineno, "nccl_version", "nccl_version", 118)
        if _at(s, m, b, "NVLS "):
            return _nvls(st, s, m, b, lineno, h)
        if _at(s, m, b, "NET/IB "):
            return _at(s, m, b, "NET/IB : Using ") and _env(st, s, m + 15, b, lineno, "net_ib", "nccl_net_ib", 105)
        if _at(s, m, b, "NET/Socket "):
            return _at(s, m, b, "NET/Socket : Using ") and _env(st, s, m + 19, b, lineno, "net_socket",
                                                                "nccl_net_socket", 115)
        if _at(s, m, b, "NET/Plugin "):
            return _at(s, m, b, "NET/Plugin : ") and _env(st, s, m + 13, b, lineno, "net_plugin", "nccl_net_plugin", 112)
    elif c == 66:  # B
        if _at(s, m, b, "Bootstrap "):
            return _at(s, m, b, "Bootstrap : Using ") and _env(st, s, m + 18, b, lineno, "bootstrap", "nccl_bootstrap",
                                                               98)
    elif _is(c, C_DIGIT):  # not a _RULES word: TUNING without its function, or the channel counts
        if _find(s, m, b, " Bytes -> ") >= 0:
            return _tuning(st, s, m, m, m, b, lineno)
        return _channels(st, s, m, b, lineno, h)
    # "func: " (a word of letters and a colon, never a _RULES word): TUNING or COLL
    k = _run(s, m, b, C_ALPHA)
    if k == m or k + 2 >= b or s[k] != 58 or s[k + 1] != 32:
        return False
    if _is(s[k + 2], C_DIGIT):
        return _tuning(st, s, m, k, k + 2, b, lineno)
    return _coll(st, s, m, k, b, lineno, h)


cdef inline Py_ssize_t _ws_digits(const chr_t* s, Py_ssize_t j, Py_ssize_t b, const char* lit, Py_ssize_t* q) noexcept nogil:
    """``<lit>\s+\d+`` at j: the digits' span into q[0:2], the end; -1 if absent."""
    cdef Py_ssize_t k
    if not _at(s, j, b, lit):
        return -1
    j += <Py_ssize_t>strlen(lit)
    k = _run(s, j, b, C_WS)
    if k == j:
        return -1
    j = _run(s, k, b, C_DIGIT)
    if j == k:
        return -1
    q[0], q[1] = k, j
    return j


cdef bint _test_comment(_State st, const chr_t* s, Py_ssize_t a, Py_ssize_t b, Py_ssize_t lineno) except -1:
    """An nccl-tests ``#`` line (NcclParser._other; the caller checked it holds no " NCCL "): a device
    line ``#\s+Rank\s+(\d+) Group\s+\d+ Pid\s+(\d+) on (\S+) device\s+(\d+) \[([^\]]+)\] (.+)$``
    (nccl._TEST_RANK) is an env record; any other is recognised, no record."""
    cdef Py_ssize_t j, k
    cdef Py_ssize_t q[10]
    cdef dict rec
    k = _run(s, a + 1, b, C_WS)
    if k == a + 1:
        return True
    j = _ws_digits(s, k, b, b"Rank", q)  # rank: q[0:2]
    if j >= 0:
        j = _ws_digits(s, j, b, b" Group", q + 2)
    if j >= 0:
        j = _ws_digits(s, j, b, b" Pid", q + 2)  # pid (unused)
    if j < 0 or not _at(s, j, b, " on "):
        return True
    q[4] = j + 4
    q[5] = j = _nonws(s, j + 4, b)  # host
    if j == q[4]:
        return True
    j = _ws_digits(s, j, b, b" device", q + 6)  # dev: q[6:8]
    if j < 0 or not _at(s, j, b, " ["):
        return True
    q[8] = j = j + 2  # bus: [^\]]+
    while j < b and s[j] != 93:
        j += 1
    q[9] = j
    if j == q[8] or not _at(s, j, b, "] ") or j + 2 >= b:
        return True
    rec = _record(st, "env", lineno, "nccl_tests_device", 7)
    rec["kind"] = "nccl"
    rec["key"] = "gpu.rank" + _text(s, q[0], q[1])
    rec["value"] = f"{_text(s, j + 2, b)} [{_text(s, q[8], q[9])}] on {_text(s, q[4], q[5])} device {_text(s, q[6], q[7])}"
    st.records.append(rec)
    return True


# ------------------------------------------------------------------ lines

cdef bint _line(_State st, const chr_t* s, Py_ssize_t a, Py_ssize_t b, Py_ssize_t lineno) except -1:
    """A normalised line a:b (first character a letter or digit, no trailing whitespace):
    ``host:pid:tid [dev] NCCL INFO <msg>`` with a message of _message."""
    cdef Py_ssize_t h[6]
    cdef Py_ssize_t i, m
    h[0] = a
    h[1] = i = _run(s, a, b, C_HOST)
    if i >= b or s[i] != 58:
        return False
    h[2] = i + 1
    h[3] = i = _run(s, i + 1, b, C_DIGIT)
    if i == h[2] or i - h[2] > MAX_DIGITS or i >= b or s[i] != 58:
        return False
    m = i + 1
    i = _run(s, m, b, C_DIGIT)
    if i == m or not _at(s, i, b, " ["):
        return False
    h[4] = i + 2
    h[5] = i = _run(s, i + 2, b, C_DIGIT)
    if i == h[4] or i - h[4] > MAX_DIGITS or not _at(s, i, b, "] NCCL INFO "):
        return False
    m = _run(s, i + 12, b, C_WS)  # msg.lstrip()
    if m >= b:
        return False
    return _message(st, s, m, b, lineno, h)


cdef bint _timestamp(const chr_t* s, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
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
        elif not _is(s[a + k], C_DIGIT):
            return False
    i = a + 19
    if i < b and (s[i] == 46 or s[i] == 44):  # (?:[.,]\d+)?
        if i + 1 >= b or not _is(s[i + 1], C_DIGIT):
            return False
        i = _run(s, i + 1, b, C_DIGIT)
    if i < b and s[i] == 90:  # Z
        i += 1
    elif i < b and (s[i] == 43 or s[i] == 45):  # [+-]\d\d:?\d\d
        if i + 3 > b or not _is(s[i + 1], C_DIGIT) or not _is(s[i + 2], C_DIGIT):
            return False
        i += 3
        if i < b and s[i] == 58:
            i += 1
        if i + 2 > b or not _is(s[i], C_DIGIT) or not _is(s[i + 1], C_DIGIT):
            return False
        i += 2
    return i == b


cdef inline Py_ssize_t _eol(const chr_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Index of the next newline at or after i, or n."""
    cdef const void* p
    if chr_t is ucs1:
        p = memchr(s + i, 10, n - i)
        return n if p == NULL else <Py_ssize_t>((<const ucs1*>p) - s)
    else:
        while i < n and s[i] != 10:
            i += 1
        return i


cdef inline bint _ascii(const chr_t* s, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    while a < b:
        if s[a] >= 128:
            return False
        a += 1
    return True


cdef Py_ssize_t _resume(const chr_t* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The newline before the next line the scanner may take after the newline at i: one that
    starts with a letter or digit and holds `` NCCL INFO `` or is short (a timestamp), or a
    ``#`` line; n if none."""
    cdef Py_ssize_t e
    while i < n:
        e = _eol(s, i + 1, n)
        if i + 1 < e and (s[i + 1] == 35 or _is(s[i + 1], C_DIGIT | C_ALPHA) and (
                e - i <= 40 or _find(s, i + 1, e, " NCCL INFO ") >= 0)):
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
        while b > a and _is(s[b - 1], C_WS):  # line.rstrip() (a non-ASCII space stays, and is refused)
            b -= 1
        if b > a:
            if not ascii and not _ascii(s, a, b):
                stopped = True
                break
            c = s[a]
            if _is(c, C_DIGIT) and _timestamp(s, a, b):
                # a timestamp line: taken if the next non-blank line is taken (its record does not use it)
                ts_pos, ts_lineno, ts_last = pos, lineno, last
                last = lineno + 1
            elif _is(c, C_DIGIT | C_ALPHA) and _line(st, s, a, b, lineno + 1):
                ts_pos = -1
                last = lineno + 1
            elif c == 35 and _find(s, a, b, " NCCL ") < 0 and _test_comment(st, s, a, b, lineno + 1):
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
         dict colls, set seen_env, Memo memo):
    """NcclParser.native_scan (see ingest.parsers.LineParser.native_scan): takes lines of text from
    the newline at pos, updating records, edges, edge_channels, colls and seen_env in place as
    NcclParser would; memo: the parser's Memo. Returns (pos, lineno, last, resume)."""
    cdef _State st = _State.__new__(_State)
    cdef int kind = PyUnicode_KIND(text)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text)
    st.source, st.records, st.edges, st.edge_channels, st.colls = source, records, edges, edge_channels, colls
    st.seen_env, st.memo = seen_env, memo
    memo.begin()
    try:
        if kind == PyUnicode_1BYTE_KIND:
            return _scan(st, <const ucs1*>PyUnicode_DATA(text), n, PyUnicode_IS_ASCII(text), pos, lineno)
        if kind == PyUnicode_2BYTE_KIND:
            return _scan(st, <const ucs2*>PyUnicode_DATA(text), n, False, pos, lineno)
        return _scan(st, <const ucs4*>PyUnicode_DATA(text), n, False, pos, lineno)
    finally:
        memo.end()  # the counts of known rows
