# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled scanners of the training-log parsers (Megatron-LM, DeepSpeed, torchtitan): the
``LineParser.native_scan`` protocol of ingest/parsers/__init__.py.

Each ``*Scan`` reads the frequent lines of its format as the parser's Python ``feed`` reads them
(same records, dict key order, values and types, same step rows and parser state) and stops
before any other line. It stops, among others, before: a line with a non-ASCII character (the
Python patterns' ``\\d``, ``\\w``, ``\\s`` and ``str.strip`` are Unicode-aware), a launcher
prefix other than indentation, ``[rankN]:``, ``[defaultN]:`` and ``[N] ``, an ISO timestamp
alone on its line, a value the Python path would raise or warn on, and every shape not named in
the class docstrings. Numbers are converted by CPython's own routine (``PyOS_string_to_double``,
what float() calls) where the text is plainly a number, and by the parser's Python converter
otherwise.

Unparsed lines are counted here only by the Runner's own rule for counting them unfed (given
``misses``: no hint of the chain, no launcher-like start, every parser idle), through the
Runner's count, with their line numbers; any other line the chain may not recognise goes to
the Python path. Deliberately not here: a line a later parser of the chain could claim. The
lines taken here are all recognised by the chain's first parser, which the Python path feeds
first and which then ends the line's way through the chain: the later parsers never see them,
whatever their state. Parser state lives in the parser (passed in, updated in place, scalars
returned); the scan objects keep only caches of recurring strings.
"""
from libc.string cimport memchr, memcmp
from cpython.object cimport PyObject
from cpython.dict cimport PyDict_GetItem, PyDict_Contains
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.set cimport PySet_Contains

cdef extern from "Python.h":
    dict _PyDict_NewPresized(Py_ssize_t)
    ctypedef unsigned char Py_UCS1
    ctypedef unsigned short Py_UCS2
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    bint PyUnicode_IS_ASCII(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    object PyUnicode_Substring(object, Py_ssize_t, Py_ssize_t)
    double PyOS_string_to_double(const char*, char**, PyObject*) except? -1.0
    bint Py_UNICODE_ISSPACE(Py_UCS4) nogil

BUILT = True

cdef enum:
    STOP = 0      # a line the Python path must take
    TAKEN = 1     # read here (records and state updated unless a dry run)
    BLANK = 2     # nothing to read (the normaliser drops it)
    NOMATCH = 3   # (inside a format) this shape does not match: try the next one
    MAXSEG = 128  # key: value segments read per line; more: the Python path
    MAXHINTS = 256  # hints of a chain counting unparsed lines here
    NUM_CHARS = 64  # longest number text converted here (longer: the Python converter)
    F_NUM = 1     # ingest.parsers.to_num: float() after dropping thousands separators
    F_INT = 2     # ingest.parsers.to_int: int() after dropping thousands separators
    F_PCT = 3     # to_num after str.rstrip("%")
    F_CALL = 4    # any other converter: called from here

cdef object _SKIP = object()  # a value put_field leaves out (its converter raised ValueError)


# ---------------------------------------------------------------- characters

cdef struct Txt:
    const void* d
    int k
    Py_ssize_t n
    bint ascii


cdef inline Py_UCS4 ch(const Txt* t, Py_ssize_t i) noexcept nogil:
    if t.k == 1:
        return (<const Py_UCS1*>t.d)[i]
    if t.k == 2:
        return (<const Py_UCS2*>t.d)[i]
    return (<const Py_UCS4*>t.d)[i]


cdef inline bint isdig(Py_UCS4 c) noexcept nogil:
    return 48 <= c <= 57


cdef enum:  # character classes of ASCII lines (bits of CLASSES)
    C_WORD = 1    # \w
    C_NUM = 2     # [\d.]
    C_TNAME = 4   # [\w\-/ .]: a timer name's characters
    C_KEY = 8     # [a-z_]: a torchtitan key's
    C_LOC = 16    # [\w.]: a DeepSpeed file name's
    C_MTS = 32    # [\d\-: .]: a Megatron bracket timestamp's
    C_HOST = 64   # [\w.\-]: a host/N launcher prefix's

cdef unsigned char CLASSES[128]


cdef void _fill_classes() noexcept:
    cdef int c
    for c in range(128):
        w = (48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122) or c == 95
        CLASSES[c] = ((C_WORD if w else 0) | (C_NUM if 48 <= c <= 57 or c == 46 else 0)
                      | (C_TNAME if w or c in (45, 47, 32, 46) else 0) | (C_KEY if 97 <= c <= 122 or c == 95 else 0)
                      | (C_LOC if w or c == 46 else 0) | (C_MTS if 48 <= c <= 57 or c in (45, 58, 32, 46) else 0)
                      | (C_HOST if w or c in (46, 45) else 0))


_fill_classes()


cdef inline bint has(Py_UCS4 c, unsigned char cls) noexcept nogil:
    return c < 128 and (CLASSES[c] & cls) != 0


cdef inline bint isword(Py_UCS4 c) noexcept nogil:  # \w of an ASCII line
    return has(c, C_WORD)


cdef inline Py_ssize_t run_of(const Txt* t, Py_ssize_t i, Py_ssize_t e, unsigned char cls) noexcept nogil:
    """End of the run of class cls characters at i."""
    while i < e and has(ch(t, i), cls):
        i += 1
    return i


cdef inline bint isspc(Py_UCS4 c) noexcept nogil:  # \s and str.strip(): Py_UNICODE_ISSPACE
    return Py_UNICODE_ISSPACE(c)


cdef inline Py_ssize_t find_nl(const Txt* t, Py_ssize_t i) noexcept nogil:
    """Index of the next newline at or after i, else the text's length."""
    cdef const char* p
    if t.k == 1:
        p = <const char*>memchr(<const char*>t.d + i, 10, t.n - i)
        return t.n if p == NULL else p - <const char*>t.d
    while i < t.n and ch(t, i) != 10:
        i += 1
    return i


cdef inline Py_ssize_t find_ch(const Txt* t, Py_ssize_t i, Py_ssize_t e, Py_UCS4 c) noexcept nogil:
    """Index of the first c in [i, e), else e."""
    cdef const char* p
    if t.k == 1 and c < 128:
        if i >= e:
            return e
        p = <const char*>memchr(<const char*>t.d + i, <int>c, e - i)
        return e if p == NULL else p - <const char*>t.d
    while i < e and ch(t, i) != c:
        i += 1
    return i


cdef inline Py_ssize_t lit(const Txt* t, Py_ssize_t i, Py_ssize_t e, const char* s) noexcept nogil:
    """The end of the ASCII literal s if it stands at i (within e), else -1."""
    cdef Py_ssize_t j = 0
    while s[j]:
        if i + j >= e or ch(t, i + j) != <Py_UCS4>(<unsigned char>s[j]):
            return -1
        j += 1
    return i + j


cdef inline bint exact(const Txt* t, Py_ssize_t i, Py_ssize_t e, const char* s) noexcept nogil:
    return lit(t, i, e, s) == e


cdef Py_ssize_t find_lit(const Txt* t, Py_ssize_t i, Py_ssize_t e, const char* s) noexcept nogil:
    """Index of the first occurrence of the ASCII literal s in [i, e), else -1."""
    cdef Py_UCS4 c0 = <unsigned char>s[0]
    while True:
        i = find_ch(t, i, e, c0)
        if i >= e:
            return -1
        if lit(t, i, e, s) >= 0:
            return i
        i += 1


cdef inline Py_ssize_t digits(const Txt* t, Py_ssize_t i, Py_ssize_t e) noexcept nogil:
    while i < e and isdig(ch(t, i)):
        i += 1
    return i


cdef inline Py_ssize_t spaces(const Txt* t, Py_ssize_t i, Py_ssize_t e) noexcept nogil:
    while i < e and isspc(ch(t, i)):
        i += 1
    return i


cdef inline Py_ssize_t strip_end(const Txt* t, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    while b > a and isspc(ch(t, b - 1)):
        b -= 1
    return b


cdef inline Py_ssize_t num_run(const Txt* t, Py_ssize_t i, Py_ssize_t e) noexcept nogil:
    """End of a ``[\\d.]+`` run (ASCII)."""
    return run_of(t, i, e, C_NUM)


cdef inline bint ascii_run(const Txt* t, Py_ssize_t a, Py_ssize_t e) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(a, e):
        if ch(t, i) >= 128:
            return False
    return True


cdef inline long long int_of(const Txt* t, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """The value of ASCII digits [a, b) (at most 18 of them)."""
    cdef long long v = 0
    cdef Py_ssize_t i
    for i in range(a, b):
        v = v * 10 + (<long long>ch(t, i) - 48)
    return v


# ---------------------------------------------------------------- numbers

cdef double[23] POW10 = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                          1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22]


cdef bint c_double(const Txt* t, Py_ssize_t a, Py_ssize_t b, bint drop_commas, double* out) except -1:
    """float(text[a:b]) (after removing commas if drop_commas) into out, if the text is plainly a
    number, ``[+-]?(\\d+\\.?\\d*|\\.\\d+)([eE][+-]?\\d+)?``; False (out untouched) where float()
    itself must decide (whitespace, underscores, inf, nan, anything else).

    A mantissa of at most 2**53 scaled by 10**k, |k| <= 22, is one IEEE multiplication or
    division of exact operands: the correctly rounded value, as dtoa's own fast path takes it
    (Clinger 1990); other numbers go to PyOS_string_to_double, what float() calls."""
    cdef char buf[NUM_CHARS + 1]
    cdef Py_ssize_t i, n = 0
    cdef Py_UCS4 c
    cdef char* end
    cdef unsigned long long m = 0
    cdef int state = 0, ndig = 0, frac = 0, expo = 0, k
    cdef bint neg = False, eneg = False, exact = True
    cdef double v
    if b - a > NUM_CHARS:
        return False
    # states: 0 start, 1 after the sign, 2 integer digits, 3 fraction, 4 after e, 5 after its sign, 6 exponent digits
    for i in range(a, b):
        c = ch(t, i)
        if 48 <= c <= 57:
            if state <= 3:
                if state < 2:
                    state = 2
                ndig += 1
                if state == 3:
                    frac += 1
                if m >= 100000000000000000ULL:  # (more digits than an exact mantissa has)
                    exact = False
                else:
                    m = m * 10 + (<unsigned long long>c - 48)
            else:
                state = 6
                if expo < 100000:
                    expo = expo * 10 + (<int>c - 48)
        elif c == 46:  # .
            if state > 2:
                return False
            state = 3
        elif c == 101 or c == 69:  # e E
            if ndig == 0 or state > 3:
                return False
            state = 4
        elif c == 43 or c == 45:  # + -
            if state == 0:
                neg, state = c == 45, 1
            elif state == 4:
                eneg, state = c == 45, 5
            else:
                return False
        elif not (c == 44 and drop_commas):
            return False
    if ndig == 0 or state == 4 or state == 5:
        return False
    k = (-expo if eneg else expo) - frac
    if exact and m <= 9007199254740992ULL and -22 <= k <= 22:
        v = <double>m
        v = v / POW10[-k] if k < 0 else v * POW10[k]
        out[0] = -v if neg else v
        return True
    for i in range(a, b):  # the text float() reads: without its commas
        c = ch(t, i)
        if c != 44:
            buf[n] = <char>c
            n += 1
    buf[n] = 0
    out[0] = PyOS_string_to_double(buf, &end, NULL)
    return end == buf + n


cdef bint c_int(const Txt* t, Py_ssize_t a, Py_ssize_t b, bint drop_commas, long long* out) noexcept nogil:
    """int(text[a:b]) (after removing commas if drop_commas) into out for ``[+-]?\\d{1,18}``."""
    cdef Py_ssize_t i, d = 0
    cdef long long v = 0
    cdef bint neg = False
    cdef Py_UCS4 c
    if a < b and (ch(t, a) == 43 or ch(t, a) == 45):
        neg = ch(t, a) == 45
        a += 1
    for i in range(a, b):
        c = ch(t, i)
        if c == 44 and drop_commas:
            continue
        if not isdig(c) or d == 18:
            return False
        v = v * 10 + (<long long>c - 48)
        d += 1
    if d == 0:
        return False
    out[0] = -v if neg else v
    return True


cdef inline bint plain_float(const Txt* t, Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """Whether a ``[\\d.]+`` run [a, b) is a number float() reads (one dot at most), not too
    long for c_double."""
    cdef Py_ssize_t i, dots = 0
    if b - a > NUM_CHARS:
        return False
    for i in range(a, b):
        if ch(t, i) == 46:
            dots += 1
    return dots <= 1 and b - a > dots


cdef object run_float(const Txt* t, Py_ssize_t a, Py_ssize_t b, double scale):
    """float(text[a:b]) * scale for a run plain_float accepts."""
    cdef double d
    if not c_double(t, a, b, False, &d):
        raise AssertionError("plain_float run not read")  # (unreachable: plain_float checked it)
    return d * scale if scale != 1.0 else d


cdef class Field:
    """One pattern-table entry ``(column, converter, scale)`` prepared for reading here."""
    cdef object column, typ, scale
    cdef int code
    cdef bint scaled, scale_c
    cdef double scale_d

    def __init__(self, spec, dict codes):
        self.column, self.typ, self.scale = spec
        self.code = {"num": F_NUM, "int": F_INT, "pct": F_PCT}.get(codes.get(self.typ), F_CALL)
        self.scaled = self.scale != 1
        self.scale_c = type(self.scale) is float or (type(self.scale) is int and abs(self.scale) < 2 ** 53)
        self.scale_d = float(self.scale) if self.scale_c else 0.0

    cdef object value(self, const Txt* t, Py_ssize_t a, Py_ssize_t b, str text):
        """``put_field``'s value of text[a:b]: typ(text) * scale, or _SKIP where typ raises ValueError."""
        cdef double d
        cdef long long i
        cdef Py_ssize_t bb = b
        if self.code == F_NUM or self.code == F_PCT:
            if self.code == F_PCT:
                while bb > a and ch(t, bb - 1) == 37:
                    bb -= 1
            if c_double(t, a, bb, True, &d):
                if not self.scaled:
                    return d
                if self.scale_c:
                    return d * self.scale_d
                return d * self.scale
        elif self.code == F_INT:
            if c_int(t, a, b, True, &i):
                return i * self.scale if self.scaled else i
        try:
            v = self.typ(PyUnicode_Substring(text, a, b))
        except ValueError:
            return _SKIP
        return v * self.scale if self.scaled else v


cdef class Strings:
    """Recurring substrings (keys, timer names) kept as str objects with a value each, found by
    their characters: no new str per line for what repeats. At most ``limit`` entries."""
    cdef list strs, vals
    cdef Py_ssize_t hint, limit

    def __init__(self, Py_ssize_t limit=512):
        self.strs, self.vals, self.hint, self.limit = [], [], 0, limit

    cdef Py_ssize_t find(self, const Txt* t, Py_ssize_t a, Py_ssize_t b) noexcept:
        """Index of the entry whose characters are text[a:b], else -1 (tries the one after the
        last found first: keys come in the same order line after line)."""
        cdef Py_ssize_t n = PyList_GET_SIZE(self.strs), L = b - a, k, idx, j
        cdef PyObject* s
        cdef const Py_UCS1* sd
        cdef bint same
        for k in range(n):
            idx = self.hint + k
            if idx >= n:
                idx -= n
            s = PyList_GET_ITEM(self.strs, idx)
            if PyUnicode_GET_LENGTH(<object>s) != L:
                continue
            sd = <const Py_UCS1*>PyUnicode_DATA(<object>s)  # (ASCII: every entry is)
            if t.k == 1:
                same = memcmp(sd, <const char*>t.d + a, L) == 0
            else:
                same = True
                for j in range(L):
                    if sd[j] != ch(t, a + j):
                        same = False
                        break
            if same:
                self.hint = idx + 1
                return idx
        return -1

    cdef Py_ssize_t add(self, str s, object v):
        if PyList_GET_SIZE(self.strs) >= self.limit:
            return -1
        self.strs.append(s)
        self.vals.append(v)
        return PyList_GET_SIZE(self.strs) - 1

    cdef inline PyObject* str_at(self, Py_ssize_t i) noexcept:  # (borrowed: the list keeps it)
        return PyList_GET_ITEM(self.strs, i)

    cdef inline object val_at(self, Py_ssize_t i):
        return <object>PyList_GET_ITEM(self.vals, i)

    cdef object name(self, const Txt* t, Py_ssize_t a, Py_ssize_t b, str text):
        """text[a:b] as a str, the kept one where there is one."""
        cdef Py_ssize_t i = self.find(t, a, b)
        if i >= 0:
            return <object>self.str_at(i)
        s = PyUnicode_Substring(text, a, b)
        self.add(s, s)
        return s


# ---------------------------------------------------------------- lines

cdef Py_ssize_t bracket_rank(const Txt* t, Py_ssize_t i, Py_ssize_t e, const char* head, long long* v) noexcept nogil:
    """The end of ``<head>\\d+]:`` at i (``[rankN]:``, ``[defaultN]:``) with N in v, else -1."""
    cdef Py_ssize_t j = lit(t, i, e, head), k
    if j < 0:
        return -1
    k = digits(t, j, e)
    if k == j or k - j > 18 or lit(t, k, e, "]:") < 0:
        return -1
    v[0] = int_of(t, j, k)
    return k + 2


cdef Py_ssize_t body_start(const Txt* t, Py_ssize_t a, Py_ssize_t e, long long* rank) noexcept nogil:
    """Where the normaliser's launcher prefix (ingest.parsers._PREFIX) ends, for the prefixes
    read here -- indentation, ``[rankN]:``, ``[defaultN]:``, ``[N] `` -- with the rank it gives
    (``[rankN]`` first, then ``[defaultN]``; -1: none); -1 where another prefix or other
    whitespace stands there. (The bodies the scanners take start so that no _PREFIX
    alternative matches there: the regex would stop where this does.)"""
    cdef long long r1 = -1, r2 = -1, v = 0
    cdef Py_ssize_t i = a, j
    cdef Py_UCS4 c
    while i < e:
        c = ch(t, i)
        if c == 32 or c == 9:
            i += 1
        elif c == 91:  # [
            j = bracket_rank(t, i, e, "[rank", &v)
            if j >= 0:
                r1, i = v, j
                continue
            j = bracket_rank(t, i, e, "[default", &v)
            if j >= 0:
                r2, i = v, j
                continue
            if i + 1 < e and isdig(ch(t, i + 1)):
                j = digits(t, i + 1, e)
                if lit(t, j, e, "] ") >= 0:
                    i = j + 2
                    continue
                if j < e and ch(t, j) == 44:
                    return -1  # "[job,N]<stdout>:": the Python normaliser
            break
        elif isspc(c):
            return -1
        else:
            break
    rank[0] = r1 if r1 >= 0 else r2
    return i


cdef dict step_row(dict steps, object rank, object step, Py_ssize_t lineno, object source, object kind):
    """StepRowParser._step_row: the row of (rank, step), made on first sight."""
    key = (rank, step)
    cdef PyObject* p = PyDict_GetItem(steps, key)
    if p != NULL:
        return <dict>p
    row = _PyDict_NewPresized(21)  # (room for the columns a row gets: no resizing on the way)
    row["table"] = "steps"
    row["source"] = source
    row["line"] = lineno
    row["kind"] = kind
    row["rank"] = rank
    row["step"] = step
    steps[key] = row
    return row


cdef class Hints


def _remake(cls, made):
    source, kwargs = made
    return cls(source, **kwargs)


cdef class _Scan:
    """The line loop of the protocol: line boundaries, trailing whitespace, the ASCII check and
    launcher prefixes here; each format's lines in ``take``."""
    cdef Hints hints  # the last chain's hints, prepared
    cdef list spare  # keys and fields made past a full cache, alive until the call ends (lines hold borrowed pointers)
    cdef tuple made  # (source, keyword arguments) it was made with

    def __cinit__(self):
        self.spare = []

    def __reduce__(self):
        """Pickled as what it was made from (parsers travel between processes): caches start empty."""
        return _remake, (type(self), self.made)

    cdef int take(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t e, Py_ssize_t lineno, object rank,
                  bint commit) except -1:
        """Read body text[b:e] of line lineno: TAKEN or STOP (commit False: say so, change nothing)."""
        return STOP

    cdef int line(self, const Txt* t, str text, Py_ssize_t a, Py_ssize_t e, Py_ssize_t lineno, bint commit) except -1:
        cdef long long r = -1
        cdef Py_ssize_t b
        while e > a and isspc(ch(t, e - 1)):  # str.rstrip()
            e -= 1
        if e == a:
            return BLANK
        if not t.ascii and not ascii_run(t, a, e):
            return STOP
        b = body_start(t, a, e, &r)
        if b < 0:
            return STOP
        if b == e:
            return BLANK  # a prefix alone
        if isdig(ch(t, b)) and e - b <= 35:
            return STOP  # maybe an ISO timestamp alone: the Python normaliser
        rank = None
        if r >= 0:
            rank = r
        return self.take(t, text, b, e, lineno, rank, commit)

    cdef tuple run(self, str text, Py_ssize_t pos, Py_ssize_t lineno, object misses):
        """The protocol's loop; misses: native_scan's ``(hints, count)`` or None."""
        cdef Txt t
        cdef Py_ssize_t a, e, last = 0, run_at = 0, run_n = 0
        cdef int r
        cdef Hints hints = None
        t.d, t.k, t.n, t.ascii = PyUnicode_DATA(text), PyUnicode_KIND(text), PyUnicode_GET_LENGTH(text), PyUnicode_IS_ASCII(text)
        if misses is not None:
            if self.hints is None or self.hints.source is not misses[0]:
                self.hints = Hints(misses[0])
            hints, count = self.hints, misses[1]
        if self.spare:
            del self.spare[:]
        while pos < t.n:
            a = pos + 1
            e = find_nl(&t, a)
            r = self.line(&t, text, a, e, lineno + 1, True)
            if r == STOP and hints is not None and hints.unrecognisable(&t, a, e):
                if run_n == 0:
                    run_at = lineno
                run_n += 1
                pos, lineno = e, lineno + 1
                continue
            if run_n:
                count(run_at, run_n)
                run_n = 0
            if r == STOP:
                return pos, lineno, last, self.resume(&t, text, e, lineno + 1, hints)
            if r == TAKEN:
                last = lineno + 1
            pos, lineno = e, lineno + 1
        if run_n:
            count(run_at, run_n)
        return pos, lineno, last, pos

    cdef Py_ssize_t resume(self, const Txt* t, str text, Py_ssize_t pos, Py_ssize_t lineno, Hints hints) except -1:
        """The newline before the first line after pos (the newline after line lineno) that a dry
        run would take (or count unparsed): the Python path takes the lines up to there."""
        cdef Py_ssize_t a, e
        while pos < t.n:
            a = pos + 1
            e = find_nl(t, a)
            lineno += 1
            if self.line(t, text, a, e, lineno, False) == TAKEN or (hints is not None and hints.unrecognisable(t, a, e)):
                return pos
            pos = e
        return t.n


cdef class Hints:
    """The chain's hints (Runner.hints: substrings of which every line a parser of the chain
    recognises holds one), to tell the lines ``Runner._gap`` counts unparsed unfed: ASCII,
    none of the hints, and no start that ``_NORMALISED_LINE`` marks (after whitespace: a digit,
    ``[``, ``(``, ``host/N [``; or nothing: a blank line)."""
    cdef readonly object source
    cdef list keep
    cdef const char* strs[MAXHINTS]
    cdef int after[MAXHINTS]  # the next hint with the same first character (-1: none)
    cdef int first[128]  # per first character, its first hint (-1: none)
    cdef Py_ssize_t n
    cdef bint never

    def __init__(self, hints):
        self.source, self.keep, self.n, self.never = hints, [], 0, False
        for c in range(128):
            self.first[c] = -1
        for h in hints:
            if not h or len(hints) > MAXHINTS:
                self.never = True  # ("" is in every line)
                return
            if not h.isascii():
                continue  # in no line counted here (those are ASCII)
            b = h.encode("ascii")
            self.keep.append(b)
            self.strs[self.n] = <const char*>b
            self.after[self.n] = self.first[b[0]]
            self.first[b[0]] = self.n
            self.n += 1

    cdef bint unrecognisable(self, const Txt* t, Py_ssize_t a, Py_ssize_t e) except -1:
        """Whether raw line text[a:e] is one the Runner counts unparsed without feeding it."""
        cdef Py_ssize_t i, j, k
        cdef Py_UCS4 c
        if self.never or (not t.ascii and not ascii_run(t, a, e)):
            return False
        i = spaces(t, a, e)
        if i == e:
            return False
        c = ch(t, i)
        if isdig(c) or c == 91 or c == 40:
            return False
        j = i
        j = run_of(t, i, e, C_HOST)
        if j > i and lit(t, j, e, "/") >= 0:  # [\w.\-]+/\d+ \[
            k = digits(t, j + 1, e)
            if k > j + 1 and lit(t, k, e, " [") >= 0:
                return False
        for i in range(a, e):
            k = self.first[ch(t, i)]
            while k >= 0:
                if lit(t, i, e, self.strs[k]) >= 0:
                    return False
                k = self.after[k]
        return True


# ---------------------------------------------------------------- Megatron-LM

cdef bint datetime_at(const Txt* t, Py_ssize_t i) noexcept nogil:
    """``datetime: \\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d`` at i (29 characters)."""
    cdef const char* shape = "datetime: 0000-00-00 00:00:00"
    cdef Py_ssize_t j
    cdef Py_UCS4 c
    for j in range(29):
        c = ch(t, i + j)
        if shape[j] == 48:
            if not isdig(c):
                return False
        elif c != <Py_UCS4>(<unsigned char>shape[j]):
            return False
    return True


cdef bint datetime_noise(const Txt* t, Py_ssize_t b, Py_ssize_t e) noexcept nogil:
    """megatron._NOISE[0]: ``(?:\\[.*\\] )?datetime: <date time>$``."""
    if e - b == 29:
        return datetime_at(t, b)
    return (e - b >= 32 and ch(t, b) == 91 and ch(t, e - 31) == 93 and ch(t, e - 30) == 32
            and datetime_at(t, e - 29))


cdef bint arguments_rule(const Txt* t, Py_ssize_t b, Py_ssize_t e) noexcept nogil:
    """megatron._NOISE[2]: ``-+ (?:end of )?arguments -+$``."""
    cdef Py_ssize_t i = b, j
    while i < e and ch(t, i) == 45:
        i += 1
    if i == b:
        return False
    i = lit(t, i, e, " ")
    if i < 0:
        return False
    j = lit(t, i, e, "end of ")
    if j >= 0:
        i = j
    i = lit(t, i, e, "arguments ")
    if i < 0 or i == e:
        return False
    while i < e and ch(t, i) == 45:
        i += 1
    return i == e


cdef class MegatronScan(_Scan):
    """MegatronParser's lines: iteration lines (megatron._ITER, read as ``_iteration`` reads
    them: every ITER_FIELDS key and the ``* loss`` rule; an unknown key not yet warned about
    stops), ``time (ms) | name: v`` timer lines (deepspeed.timer_records, step: the parser's
    last iteration), ``[Rank r] (after N iterations) memory (MB)`` lines and the ``_NOISE`` lines."""
    cdef object source, kind, field_spec, to_num
    cdef dict codes, mem_fields
    cdef Strings keys, mem_keys, names
    cdef list records
    cdef dict steps
    cdef object last_step
    cdef set unknown

    def __init__(self, source, *, kind, field_spec, mem_fields, converters, to_num):
        """field_spec: key -> (column, converter, scale) or None (megatron's rule for iteration
        keys); mem_fields: memory-line key -> column; converters: converter -> "num" / "int"."""
        self.made = (source, dict(kind=kind, field_spec=field_spec, mem_fields=mem_fields, converters=converters, to_num=to_num))
        self.source, self.kind, self.field_spec, self.to_num = source, kind, field_spec, to_num
        self.codes, self.mem_fields = dict(converters), dict(mem_fields)
        self.keys, self.mem_keys, self.names = Strings(), Strings(), Strings()

    def scan(self, str text, Py_ssize_t pos, Py_ssize_t lineno, misses, list records, dict steps, last_step, set unknown):
        """native_scan with the parser's state: returns (pos, lineno, last, resume, last_step)."""
        self.records, self.steps, self.last_step, self.unknown = records, steps, last_step, unknown
        try:
            pos, lineno, last, resume = self.run(text, pos, lineno, misses)
            return pos, lineno, last, resume, self.last_step
        finally:
            self.records = self.steps = self.unknown = self.last_step = None

    cdef int take(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t e, Py_ssize_t lineno, object rank,
                  bint commit) except -1:
        # The order of MegatronParser.feed: iteration, timers, memory, then (for what starts
        # like them) the "..." rules, which none of the noise lines taken here matches, and _NOISE.
        cdef Py_UCS4 c = ch(t, b)
        cdef int r
        if c == 105 or c == 91:  # i [
            r = self.iteration(t, text, b, e, lineno, rank, commit)
            if r != NOMATCH:
                return r
            if c == 105:
                return STOP
            if lit(t, b, e, "[Rank ") >= 0:
                r = self.memory(t, text, b, e, lineno, commit)
                if r != NOMATCH:
                    return r
            return TAKEN if datetime_noise(t, b, e) else STOP
        if c == 116:  # t
            if lit(t, b, e, "time (ms)") >= 0:
                return self.timers(t, text, b, e, lineno, rank, commit)
            return TAKEN if exact(t, b, e, "training ...") else STOP
        if c == 100:  # d
            return TAKEN if exact(t, b, e, "done with setup ...") or datetime_noise(t, b, e) else STOP
        if c == 68:  # D
            return TAKEN if exact(t, b, e, "Done with setup ...") else STOP
        if c == 45:  # -
            return TAKEN if arguments_rule(t, b, e) else STOP
        if c == 40:  # (
            return TAKEN if exact(t, b, e, "(min, max) time across ranks (ms):") else STOP
        return STOP

    cdef Field key_field(self, const Txt* t, str text, Py_ssize_t a, Py_ssize_t b, PyObject** key):
        """The prepared pattern-table entry of iteration key text[a:b] (None: not in the table),
        its str in key[0]."""
        cdef Py_ssize_t i = self.keys.find(t, a, b)
        if i >= 0:
            key[0] = self.keys.str_at(i)
            return self.keys.val_at(i)
        k = PyUnicode_Substring(text, a, b)
        spec = self.field_spec(k)
        f = None if spec is None else Field(spec, self.codes)
        i = self.keys.add(k, f)
        if i < 0:
            self.spare.append(k)
            self.spare.append(f)
        key[0] = <PyObject*>k
        return f

    cdef int iteration(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t e, Py_ssize_t lineno, object rank,
                       bint commit) except -1:
        """megatron._ITER: ``(?:\\[ts\\] )?iteration\\s+N/\\s*M \\|rest``, rest read as
        MegatronParser._iteration reads it (segments at ``|``, ``key: value`` stripped)."""
        cdef Py_ssize_t p = b, q, s0, s1, n0, n1, ts0 = -1, ts1 = -1, i, j, c, k0, k1, v0, v1, n = 0
        cdef Py_ssize_t va[MAXSEG]
        cdef Py_ssize_t vb[MAXSEG]
        cdef PyObject* fl[MAXSEG]
        cdef PyObject* key = NULL
        cdef Field f
        if ch(t, p) == 91:
            q = run_of(t, p + 1, e, C_MTS)
            if q == p + 1 or lit(t, q, e, "] ") < 0:
                return NOMATCH
            ts0, ts1, p = p + 1, q, q + 2
        p = lit(t, p, e, "iteration")
        if p < 0:
            return NOMATCH
        s0 = spaces(t, p, e)
        s1 = digits(t, s0, e)
        if s0 == p or s1 == s0 or lit(t, s1, e, "/") < 0:
            return NOMATCH
        n0 = spaces(t, s1 + 1, e)
        n1 = digits(t, n0, e)
        if n1 == n0 or lit(t, n1, e, " |") < 0:
            return NOMATCH
        if s1 - s0 > 18 or n1 - n0 > 18:
            return STOP
        i = n1 + 2
        while True:  # rest.split("|"); seg.partition(":")
            j = find_ch(t, i, e, 124)
            c = find_ch(t, i, j, 58)
            if c < j:
                k0, k1 = spaces(t, i, c), c
                while k1 > k0 and isspc(ch(t, k1 - 1)):
                    k1 -= 1
                v0, v1 = spaces(t, c + 1, j), j
                while v1 > v0 and isspc(ch(t, v1 - 1)):
                    v1 -= 1
                if v1 > v0:  # (an empty value is skipped before the key is looked at)
                    f = self.key_field(t, text, k0, k1, &key)
                    if f is None:
                        if commit and not PySet_Contains(self.unknown, <object>key):
                            return STOP  # the Python path warns about it once
                    else:
                        if n == MAXSEG:
                            return STOP
                        va[n], vb[n], fl[n] = v0, v1, <PyObject*>f
                        n += 1
            if j >= e:
                break
            i = j + 1
        if not commit:
            return TAKEN
        step = int_of(t, s0, s1)
        row = step_row(self.steps, rank, step, lineno, self.source, self.kind)
        row["time"] = PyUnicode_Substring(text, ts0, ts1) if ts0 >= 0 else None
        row["num_steps_total"] = int_of(t, n0, n1)
        for i in range(n):
            f = <Field>fl[i]
            v = f.value(t, va[i], vb[i], text)
            if v is not _SKIP:
                row[f.column] = v
        if not PyDict_Contains(row, "loss"):
            row["loss"] = None
        self.last_step = step
        return TAKEN

    cdef int timers(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t e, Py_ssize_t lineno, object rank,
                    bint commit) except -1:
        """deepspeed.timer_records of a ``time (ms)`` line: ``\\|\\s*([\\w\\-/.][\\w\\-/ .]*): ([\\d.]+)``
        found in turn after ``time (ms) ``; a value float() refuses stops (the Python path raises)."""
        cdef Py_ssize_t p = lit(t, b, e, "time (ms) |"), i, j, m, n = 0
        cdef Py_ssize_t n0[MAXSEG]
        cdef Py_ssize_t n1[MAXSEG]
        cdef Py_ssize_t v0[MAXSEG]
        cdef Py_ssize_t v1[MAXSEG]
        if p < 0:
            return TAKEN  # recognised, no timer in it
        i = p - 1
        while True:  # every value checked before any record is made
            j = find_ch(t, i, e, 124)
            if j >= e:
                break
            if n == MAXSEG:
                return STOP
            m = timer_segment(t, j, e, &n0[n], &n1[n], &v0[n], &v1[n])
            if m < 0:
                i = j + 1
                continue
            if not plain_float(t, v0[n], v1[n]):
                return STOP
            n += 1
            i = m
        if not commit or n == 0:
            return TAKEN
        base = {"table": "timers", "source": self.source, "line": lineno, "kind": "megatron", "rank": rank,
                "step": self.last_step, "name": None, "time_s": None}  # (copied, then name and time_s replaced)
        for i in range(n):
            rec = base.copy()
            rec["name"] = self.names.name(t, n0[i], n1[i], text)
            rec["time_s"] = run_float(t, v0[i], v1[i], 1e-3)
            self.records.append(rec)
        return TAKEN

    cdef int memory(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t e, Py_ssize_t lineno, bint commit) except -1:
        """megatron._MEM: ``[Rank r] (after N iterations) memory (MB) |rest``, MEM_FIELDS keys read
        with to_num / 1024; a value to_num refuses stops (the Python path raises)."""
        cdef Py_ssize_t r0 = b + 6, r1, s0, s1, p, i, j, c, k0, k1, v0, v1, idx
        cdef double d
        r1 = digits(t, r0, e)
        if r1 == r0:
            return NOMATCH
        s0 = lit(t, r1, e, "] (after ")
        if s0 < 0:
            return NOMATCH
        s1 = digits(t, s0, e)
        if s1 == s0:
            return NOMATCH
        p = lit(t, s1, e, " iterations) memory (MB) |")
        if p < 0:
            return NOMATCH
        if r1 - r0 > 18 or s1 - s0 > 18:
            return STOP
        values = []
        i = p
        while True:  # rest.split("|"); seg.partition(":")
            j = find_ch(t, i, e, 124)
            c = find_ch(t, i, j, 58)
            k0, k1 = spaces(t, i, c), c
            while k1 > k0 and isspc(ch(t, k1 - 1)):
                k1 -= 1
            idx = self.mem_keys.find(t, k0, k1)
            if idx < 0:
                k = PyUnicode_Substring(text, k0, k1)
                col = self.mem_fields.get(k)
                self.mem_keys.add(k, col)
            else:
                col = self.mem_keys.val_at(idx)
            if col:
                v0 = v1 = j
                if c < j:
                    v0 = spaces(t, c + 1, j)
                while v1 > v0 and isspc(ch(t, v1 - 1)):
                    v1 -= 1
                if c_double(t, v0, v1, True, &d):
                    values.append((col, d / 1024))
                else:
                    try:
                        values.append((col, self.to_num(PyUnicode_Substring(text, v0, v1)) / 1024))
                    except Exception:
                        return STOP
            if j >= e:
                break
            i = j + 1
        if not commit:
            return TAKEN
        row = step_row(self.steps, int_of(t, r0, r1), int_of(t, s0, s1), lineno, self.source, self.kind)
        for col, v in values:
            row[col] = v
        return TAKEN


cdef Py_ssize_t timer_segment(const Txt* t, Py_ssize_t j, Py_ssize_t e, Py_ssize_t* n0, Py_ssize_t* n1,
                              Py_ssize_t* v0, Py_ssize_t* v1) noexcept nogil:
    """deepspeed._TIMER_SEGS at the bar at j: its end, name and value, else -1. (The name's
    class holds neither ':' nor the first character's exclusions, so greedy reading is the
    regex's only way.)"""
    cdef Py_ssize_t k = spaces(t, j + 1, e)
    cdef Py_UCS4 c
    if k >= e:
        return -1
    c = ch(t, k)
    if c == 32 or not has(c, C_TNAME):
        return -1
    n0[0] = k
    k = run_of(t, k + 1, e, C_TNAME)
    n1[0] = k
    k = lit(t, k, e, ": ")
    if k < 0:
        return -1
    v0[0] = k
    v1[0] = num_run(t, k, e)
    if v1[0] == k:
        return -1
    return v1[0]


# ---------------------------------------------------------------- DeepSpeed

cdef Py_ssize_t comma_ts(const Txt* t, Py_ssize_t i, Py_ssize_t e) noexcept nogil:
    """End of ``\\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d,\\d+`` at i, else -1."""
    cdef const char* shape = "0000-00-00 00:00:00,"
    cdef Py_ssize_t j, k
    cdef Py_UCS4 c
    if e - i < 21:
        return -1
    for j in range(20):
        c = ch(t, i + j)
        if shape[j] == 48:
            if not isdig(c):
                return -1
        elif c != <Py_UCS4>(<unsigned char>shape[j]):
            return -1
    k = digits(t, i + 20, e)
    return k if k > i + 20 else -1


cdef inline Py_ssize_t word_run(const Txt* t, Py_ssize_t i, Py_ssize_t e) noexcept nogil:
    return run_of(t, i, e, C_WORD)


cdef Py_ssize_t upper_run(const Txt* t, Py_ssize_t i, Py_ssize_t e) noexcept nogil:
    while i < e and 65 <= ch(t, i) <= 90:
        i += 1
    return i


cdef Py_ssize_t mem_size(const Txt* t, Py_ssize_t i, Py_ssize_t e, bint last) noexcept nogil:
    """End of ``[\\d.]+\\w*B`` at i: where the regex ends it when a non-word character must
    follow (last False: ", MaxMemAllocated=") or nothing (last True: at the last B), else -1."""
    cdef Py_ssize_t d = num_run(t, i, e), w, k
    if d == i:
        return -1
    w = word_run(t, d, e)
    if not last:
        return w if w > d and ch(t, w - 1) == 66 else -1
    k = w
    while k > d and ch(t, k - 1) != 66:
        k -= 1
    return k if k > d else -1


cdef class DeepSpeedScan(_Scan):
    """DeepSpeedParser's ``[ts] [LEVEL] [file.py:N:func] msg`` lines (deepspeed._PREFIX) whose
    message (stripped, after one ``[Rank r] ``) is a ``step=`` progress line (_STEP) or an old /
    new throughput-timer line (_NEW_TIMER, _OLD_TIMER), read as ``_message`` reads them;
    ``see_memory_usage`` lines and every other message stop."""
    cdef object source, kind, to_gib
    cdef list records
    cdef dict steps
    cdef object last_step, last_rank

    def __init__(self, source, *, kind, to_gib):
        self.made = (source, dict(kind=kind, to_gib=to_gib))
        self.source, self.kind, self.to_gib = source, kind, to_gib

    def scan(self, str text, Py_ssize_t pos, Py_ssize_t lineno, misses, list records, dict steps, last_step, last_rank):
        """native_scan with the parser's state: returns (pos, lineno, last, resume, last_step, last_rank)."""
        self.records, self.steps, self.last_step, self.last_rank = records, steps, last_step, last_rank
        try:
            pos, lineno, last, resume = self.run(text, pos, lineno, misses)
            return pos, lineno, last, resume, self.last_step, self.last_rank
        finally:
            self.records = self.steps = self.last_step = self.last_rank = None

    cdef dict row(self, object rank, object step, Py_ssize_t lineno):
        """DeepSpeedParser._row."""
        if rank is None:
            rank = self.last_rank
        else:
            self.last_rank = rank
        self.last_step = step
        return step_row(self.steps, rank, step, lineno, self.source, self.kind)

    cdef int take(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t e, Py_ssize_t lineno, object rank,
                  bint commit) except -1:
        cdef Py_ssize_t ts1, f0, f1, p, q0, q1
        cdef int r
        if ch(t, b) != 91:
            return STOP
        ts1 = comma_ts(t, b + 1, e)  # [ts] [LEVEL] [file.py:N:func]
        if ts1 < 0 or lit(t, ts1, e, "] [") < 0:
            return STOP
        p = upper_run(t, ts1 + 3, e)
        if p == ts1 + 3 or lit(t, p, e, "] [") < 0:
            return STOP
        q0 = p + 3
        p = q0
        p = run_of(t, p, e, C_LOC)
        if p == q0 or lit(t, p, e, ":") < 0:
            return STOP
        q1 = digits(t, p + 1, e)
        if q1 == p + 1 or lit(t, q1, e, ":") < 0:
            return STOP
        f0 = q1 + 1
        f1 = word_run(t, f0, e)
        if f1 == f0 or lit(t, f1, e, "]") < 0:
            return STOP
        p = spaces(t, f1 + 1, e)  # "] ?" and msg.strip()
        if lit(t, p, e, "[Rank ") >= 0:
            q0 = p + 6
            q1 = digits(t, q0, e)
            if q1 > q0 and lit(t, q1, e, "] ") >= 0:
                if q1 - q0 > 18:
                    return STOP
                rank, p = int_of(t, q0, q1), q1 + 2
        if f1 - f0 == 16 and lit(t, f0, e, "see_memory_usage") >= 0:
            return STOP  # a memory label: the Python path
        r = self.step(t, text, b, ts1, p, e, lineno, rank, commit)
        if r == NOMATCH:
            r = self.timer(t, text, b, ts1, p, e, lineno, rank, commit)
        return STOP if r == NOMATCH else r

    cdef int step(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t ts1, Py_ssize_t p, Py_ssize_t e,
                  Py_ssize_t lineno, object rank, bint commit) except -1:
        """deepspeed._STEP: ``(?:\\[Rank r\\] )?step=N, skipped=K, lr=\\[([^\\],]+)``."""
        cdef Py_ssize_t q, r0 = -1, r1 = -1, s0, s1, k0, k1, l0, l1
        cdef double d
        q = lit(t, p, e, "[Rank ")
        if q >= 0:
            r0 = q
            r1 = digits(t, q, e)
            q = lit(t, r1, e, "] ") if r1 > r0 else -1
            if q < 0:
                r0 = -1
        if q < 0:
            q = p
        s0 = lit(t, q, e, "step=")
        if s0 < 0:
            return NOMATCH
        s1 = digits(t, s0, e)
        k0 = lit(t, s1, e, ", skipped=") if s1 > s0 else -1
        if k0 < 0:
            return NOMATCH
        k1 = digits(t, k0, e)
        l0 = lit(t, k1, e, ", lr=[") if k1 > k0 else -1
        if l0 < 0:
            return NOMATCH
        l1 = l0
        while l1 < e and ch(t, l1) != 93 and ch(t, l1) != 44:
            l1 += 1
        if l1 == l0:
            return NOMATCH
        if s1 - s0 > 18 or k1 - k0 > 18 or (r0 >= 0 and r1 - r0 > 18):
            return STOP
        if not commit:
            return TAKEN
        if r0 >= 0:
            rank = int_of(t, r0, r1)
        row = self.row(rank, int_of(t, s0, s1), lineno)
        row["time"] = PyUnicode_Substring(text, b + 1, ts1)
        row["num_skipped_iterations"] = int_of(t, k0, k1)
        if c_double(t, l0, l1, False, &d):  # (around it, float() strips less than str.strip(): no \x1c-\x1f)
            row["lr"] = d
        else:
            try:
                row["lr"] = float(PyUnicode_Substring(text, l0, l1))
            except ValueError:
                pass
        return TAKEN

    cdef int timer(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t ts1, Py_ssize_t p, Py_ssize_t e,
                   Py_ssize_t lineno, object rank, bint commit) except -1:
        """deepspeed._NEW_TIMER, else _OLD_TIMER, with their optional MemAllocated part."""
        cdef Py_ssize_t q, s0, s1, a0 = -1, a1 = -1, c0, c1, m0 = -1, m1 = -1, x0 = -1, x1 = -1
        q = lit(t, p, e, "epoch=")
        if q >= 0:
            q = digits(t, q, e)
            q = lit(t, q, e, "/micro_step=") if q > p + 6 else -1
            if q < 0:
                return NOMATCH
            s0 = digits(t, q, e)
            q = lit(t, s0, e, "/global_step=") if s0 > q else -1
            if q < 0:
                return NOMATCH
            s0 = q
            s1 = digits(t, s0, e)
            a0 = lit(t, s1, e, ", RunningAvgSamplesPerSec=") if s1 > s0 else -1
            if a0 < 0:
                return NOMATCH
            a1 = num_run(t, a0, e)
            c0 = lit(t, a1, e, ", CurrSamplesPerSec=") if a1 > a0 else -1
        else:
            q = digits(t, p, e)
            s0 = lit(t, q, e, "/") if q > p else -1
            if s0 < 0:
                return NOMATCH
            s1 = digits(t, s0, e)
            c0 = lit(t, s1, e, ", SamplesPerSec=") if s1 > s0 else -1
        if c0 < 0:
            return NOMATCH
        c1 = num_run(t, c0, e)
        if c1 == c0:
            return NOMATCH
        q = lit(t, c1, e, ", MemAllocated=")
        if q >= 0:
            m0 = q
            m1 = mem_size(t, m0, e, False)
            q = lit(t, m1, e, ", MaxMemAllocated=") if m1 >= 0 else -1
            if q >= 0:
                x0 = q
                x1 = mem_size(t, x0, e, True)
            if x1 < 0:
                m0 = -1
        # the values the Python path converts, checked before anything changes (it raises on them)
        if s1 - s0 > 18 or not plain_float(t, c0, c1) or (a0 >= 0 and not plain_float(t, a0, a1)):
            return STOP
        if m0 >= 0:
            try:
                ma = self.to_gib(PyUnicode_Substring(text, m0, m1))
                mma = self.to_gib(PyUnicode_Substring(text, x0, x1))
            except Exception:
                return STOP
        if not commit:
            return TAKEN
        row = self.row(rank, int_of(t, s0, s1), lineno)
        if not PyDict_Contains(row, "time"):
            row["time"] = PyUnicode_Substring(text, b + 1, ts1)
        row["samples_per_s"] = run_float(t, c0, c1, 1.0)
        if a0 >= 0:
            row["samples_per_s_running_avg"] = run_float(t, a0, a1, 1.0)
        if m0 >= 0:
            row["mem_allocated_gib"] = ma
            row["mem_max_allocated_gib"] = mma
        return TAKEN



# ---------------------------------------------------------------- torchtitan

cdef class TorchtitanScan(_Scan):
    """TorchtitanParser's ``[titan] ts - logger - LEVEL - msg`` lines (torchtitan._LINE) whose
    message is a step line (``step:`` first, _KV pairs read with STEP_FIELDS and _MEMORY, as
    ``_message`` reads them) or one of the _EVENTS; every other message stops."""
    cdef object source
    cdef dict codes
    cdef object field_spec
    cdef Strings keys
    cdef list records

    def __init__(self, source, *, field_spec, converters):
        """field_spec: key -> (column, converter, scale) or None (torchtitan.STEP_FIELDS.get);
        converters: converter -> "num" / "int" / "pct"."""
        self.made = (source, dict(field_spec=field_spec, converters=converters))
        self.source, self.field_spec, self.codes = source, field_spec, dict(converters)
        self.keys = Strings()

    def scan(self, str text, Py_ssize_t pos, Py_ssize_t lineno, misses, list records):
        """native_scan with the parser's records: returns (pos, lineno, last, resume)."""
        self.records = records
        try:
            return self.run(text, pos, lineno, misses)
        finally:
            self.records = None

    cdef object field(self, const Txt* t, str text, Py_ssize_t a, Py_ssize_t b):
        cdef Py_ssize_t i = self.keys.find(t, a, b)
        if i >= 0:
            return self.keys.val_at(i)
        k = PyUnicode_Substring(text, a, b)
        spec = self.field_spec(k)
        f = None if spec is None else Field(spec, self.codes)
        self.keys.add(k, f)  # (past the cache's limit: made again next time)
        return f

    cdef int take(self, const Txt* t, str text, Py_ssize_t b, Py_ssize_t e, Py_ssize_t lineno, object rank,
                  bint commit) except -1:
        cdef Py_ssize_t p = b, ts0, ts1, m0
        p = lit(t, b, e, "[titan] ")
        if p < 0:
            p = b
        ts0 = p
        ts1 = comma_ts(t, ts0, e)
        if ts1 < 0:
            return STOP
        p = lit(t, ts1, e, " - ")
        if p < 0:
            return STOP
        m0 = word_run(t, p, e)
        p = lit(t, m0, e, " - ") if m0 > p else -1
        if p < 0:
            return STOP
        m0 = upper_run(t, p, e)
        p = lit(t, m0, e, " - ") if m0 > p else -1
        if p < 0:
            return STOP
        if lit(t, p, e, "step:") >= 0:
            return self.step(t, text, ts0, ts1, p, e, lineno, rank, commit)
        return self.event(t, text, ts0, ts1, p, e, lineno, rank, commit)

    cdef int step(self, const Txt* t, str text, Py_ssize_t ts0, Py_ssize_t ts1, Py_ssize_t m, Py_ssize_t e,
                  Py_ssize_t lineno, object rank, bint commit) except -1:
        """The _KV pairs ``[a-z_]+:\\s+\\S+`` found in turn in the message."""
        cdef Py_ssize_t i = m, k0, k1, v0, v1, g1, p0, p1, q
        cdef Py_UCS4 c
        row = _PyDict_NewPresized(14)  # (room for the columns a row gets: no resizing on the way)
        row["table"] = "steps"
        row["source"] = self.source
        row["line"] = lineno
        row["kind"] = "torchtitan"
        row["rank"] = rank
        row["time"] = PyUnicode_Substring(text, ts0, ts1)
        while i < e:
            c = ch(t, i)
            if not has(c, C_KEY):
                i += 1
                continue
            k0 = i
            k1 = run_of(t, i + 1, e, C_KEY)
            i = k1  # (a start inside the key ends at the same place: the same failure)
            if k1 >= e or ch(t, k1) != 58:
                continue
            v0 = spaces(t, k1 + 1, e)
            if v0 == k1 + 1 or v0 >= e:
                continue
            v1 = v0
            while v1 < e and not isspc(ch(t, v1)):
                v1 += 1
            i = v1
            if k1 - k0 == 6 and lit(t, k0, e, "memory") >= 0:  # _MEMORY: [\d.]+GiB\([\d.]+%\)
                g1 = num_run(t, v0, v1)
                p0 = lit(t, g1, v1, "GiB(") if g1 > v0 else -1
                if p0 >= 0:
                    p1 = num_run(t, p0, v1)
                    if p1 > p0 and lit(t, p1, v1, "%)") >= 0:
                        if not plain_float(t, v0, g1) or not plain_float(t, p0, p1):
                            return STOP  # float() raises there: the Python path
                        row["mem_max_reserved_gib"] = run_float(t, v0, g1, 1.0)
                        row["mem_max_reserved_pct"] = run_float(t, p0, p1, 1.0)
                continue
            f = self.field(t, text, k0, k1)
            if f is not None:
                v = (<Field>f).value(t, v0, v1, text)
                if v is not _SKIP:
                    row[(<Field>f).column] = v
        if not PyDict_Contains(row, "step"):
            return STOP  # not recognised: the later parsers' turn
        if not PyDict_Contains(row, "loss"):
            row["loss"] = None
        if commit:
            self.records.append(row)
        return TAKEN

    cdef int event(self, const Txt* t, str text, Py_ssize_t ts0, Py_ssize_t ts1, Py_ssize_t m, Py_ssize_t e,
                   Py_ssize_t lineno, object rank, bint commit) except -1:
        """torchtitan._EVENTS, searched in order in the message."""
        cdef Py_ssize_t o = m, q, s0 = -1, s1 = -1, n0 = -1, n1 = -1
        name = None
        while True:  # gc: \\[GC\\] Pe(?:r)?forming periodical GC collection\\. ([\\d.]+) seconds
            o = find_lit(t, o, e, "[GC] Pe")
            if o < 0:
                break
            q = o + 7
            if q < e and ch(t, q) == 114:
                q += 1
            q = lit(t, q, e, "forming periodical GC collection. ")
            if q >= 0:
                s0, s1 = q, num_run(t, q, e)
                if s1 > s0 and lit(t, s1, e, " seconds") >= 0:
                    name = "gc"
                    break
            o += 1
        o = m
        while name is None:  # profiler_dump: Dumping profiler traces at step (\\d+)
            o = find_lit(t, o, e, "Dumping profiler traces at step ")
            if o < 0:
                break
            n0 = lit(t, o, e, "Dumping profiler traces at step ")
            n1 = digits(t, n0, e)
            if n1 > n0:
                name, s0 = "profiler_dump", -1
                break
            o += 1
        o = m
        while name is None:  # profiler_dump_done: Finished dumping profiler traces in ([\\d.]+) seconds
            o = find_lit(t, o, e, "Finished dumping profiler traces in ")
            if o < 0:
                return STOP  # no event: the later parsers' turn
            s0 = lit(t, o, e, "Finished dumping profiler traces in ")
            s1 = num_run(t, s0, e)
            if s1 > s0 and lit(t, s1, e, " seconds") >= 0:
                name, n0 = "profiler_dump_done", -1
                break
            o += 1
        if (s0 >= 0 and not plain_float(t, s0, s1)) or (n0 >= 0 and n1 - n0 > 18):
            return STOP  # float() raises there, or a step number past int64: the Python path
        if commit:
            duration = step = None
            if s0 >= 0:
                duration = run_float(t, s0, s1, 1.0)
            if n0 >= 0:
                step = int_of(t, n0, n1)
            self.records.append({"table": "events", "source": self.source, "line": lineno, "event": name,
                                 "rank": rank, "time": PyUnicode_Substring(text, ts0, ts1),
                                 "detail": PyUnicode_Substring(text, m, min(e, m + 500)),
                                 "duration_s": duration, "step": step})
        return TAKEN


def read_float(str text, bint drop_commas=False):
    """float(text) as the scanners read numbers (c_double), None where they leave it to float()
    (tests compare the two)."""
    cdef Txt t
    cdef double d
    t.d, t.k, t.n, t.ascii = PyUnicode_DATA(text), PyUnicode_KIND(text), PyUnicode_GET_LENGTH(text), PyUnicode_IS_ASCII(text)
    return d if c_double(&t, 0, t.n, drop_commas, &d) else None
