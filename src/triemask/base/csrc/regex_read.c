/* ------------------------------------------------------------------ reading a finite pattern */

/* regex_program(pattern str, max_count) -> bytearray of int32, or None: the program that
 * pattern_dag reads (_program in triemask.sets.regex: `0 n (len (lo hi)*len)*n` byte-range
 * sequences, `1 n part*n` a concatenation, `2 n option*n` an alternation, `3 low high body` a
 * repetition), read from the pattern's text here as the reference reader (_Parser) reads it.
 *
 * None hands the pattern to the reference reader: every pattern it refuses (so that its error
 * names the cause and the position) and the few forms only it reads (non-ASCII characters where
 * it asks str.isdigit or str.isalnum, `\u{0x41}`, a `\x` escape cut short by the pattern's
 * end, counts of ten digits or more). So a pattern reads here exactly as there, or there; the
 * tests compare the two programs on random patterns. Reading a pattern here takes microseconds,
 * against a quarter of a millisecond in Python for IPv6's 573 characters (a third of its compile
 * in the lazy layout). */

#define READ_END 0xFFFFFFFFu  /* peek's answer past the pattern's end */
#define READ_MAX_CODE 0x10FFFF

typedef struct {
    const Py_UCS4 *text;
    Py_ssize_t length, pos;
    int32_t max_count;
    Int32s out;     /* the program */
    int no_memory;  /* else a failed call means "read it in Python" */
} Reader;

static inline Py_UCS4 read_peek(const Reader *r) {
    return r->pos < r->length ? r->text[r->pos] : READ_END;
}

static inline int read_at(const Reader *r, Py_ssize_t at, Py_UCS4 c) {
    return at < r->length && r->text[at] == c;
}

static int read_push(Reader *r, int32_t value) {
    if (ints_append(&r->out, value) < 0) {
        r->no_memory = 1;
        return -1;
    }
    return 0;
}

/* Three entries (a repetition's head) before the program's entries from `at` on. */
static int read_insert3(Reader *r, Py_ssize_t at, int32_t a, int32_t b, int32_t c) {
    int64_t end = r->out.size;
    if (ints_extend(&r->out, 3) < 0) {
        r->no_memory = 1;
        return -1;
    }
    memmove(r->out.data + at + 3, r->out.data + at, (size_t)(end - at) * sizeof(int32_t));
    r->out.data[at] = a, r->out.data[at + 1] = b, r->out.data[at + 2] = c;
    return 0;
}

/* A head of two entries (kind, count) at `at`, kept with its count, or dropped for one child
 * (a group of one part is that part, as the reference's tree has it). */
static void read_close(Reader *r, Py_ssize_t at, int32_t count) {
    if (count != 1) {
        r->out.data[at + 1] = count;
        return;
    }
    memmove(r->out.data + at, r->out.data + at + 2, (size_t)(r->out.size - at - 2) * sizeof(int32_t));
    r->out.size -= 2;
}

static int compare_range(const void *x, const void *y) {
    const int32_t *a = (const int32_t *)x, *b = (const int32_t *)y;
    return a[0] != b[0] ? (a[0] > b[0]) - (a[0] < b[0]) : (a[1] > b[1]) - (a[1] < b[1]);
}

/* Sorted and merged where they touch (_normalise), in place. */
static void ranges_normalise(Int32s *ranges) {
    int64_t n = ranges->size / 2, kept = 0;
    int32_t *d = ranges->data;
    if (n > 1) {
        qsort(d, (size_t)n, 2 * sizeof(int32_t), compare_range);
    }
    for (int64_t i = 0; i < n; i++) {
        if (kept > 0 && d[2 * i] <= d[2 * kept - 1] + 1) {
            d[2 * kept - 1] = d[2 * i + 1] > d[2 * kept - 1] ? d[2 * i + 1] : d[2 * kept - 1];
        } else {
            d[2 * kept] = d[2 * i], d[2 * kept + 1] = d[2 * i + 1], kept++;
        }
    }
    ranges->size = 2 * kept;
}

/* The code points outside normalised `ranges` (_complement), in place. */
static int ranges_complement(Int32s *ranges) {
    int64_t n = ranges->size / 2;
    Int32s out = {0};
    int32_t start = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ranges->data[2 * i] > start && ints_push(&out, 2, start, ranges->data[2 * i] - 1, 0, 0) < 0) {
            free(out.data);
            return -1;
        }
        start = ranges->data[2 * i + 1] + 1;
    }
    if (start <= READ_MAX_CODE && ints_push(&out, 2, start, READ_MAX_CODE, 0, 0) < 0) {
        free(out.data);
        return -1;
    }
    free(ranges->data);
    *ranges = out;
    return 0;
}

static int utf8_encode(uint32_t point, uint8_t *out) {
    if (point < 0x80) {
        out[0] = (uint8_t)point;
        return 1;
    }
    if (point < 0x800) {
        out[0] = (uint8_t)(0xC0 | point >> 6), out[1] = (uint8_t)(0x80 | (point & 0x3F));
        return 2;
    }
    if (point < 0x10000) {
        out[0] = (uint8_t)(0xE0 | point >> 12), out[1] = (uint8_t)(0x80 | (point >> 6 & 0x3F));
        out[2] = (uint8_t)(0x80 | (point & 0x3F));
        return 3;
    }
    out[0] = (uint8_t)(0xF0 | point >> 18), out[1] = (uint8_t)(0x80 | (point >> 12 & 0x3F));
    out[2] = (uint8_t)(0x80 | (point >> 6 & 0x3F)), out[3] = (uint8_t)(0x80 | (point & 0x3F));
    return 4;
}

/* The byte-range sequences encoding exactly lo .. hi (no surrogates inside), appended as
 * `len (lo hi)*len` and counted: _utf8_sequences, split for split. */
static int utf8_sequences(Reader *r, uint32_t lo, uint32_t hi, int32_t *count) {
    static const uint32_t boundaries[3] = {0x7F, 0x7FF, 0xFFFF}; /* one encoded length at a time */
    for (int i = 0; i < 3; i++) {
        if (lo <= boundaries[i] && boundaries[i] < hi) {
            return utf8_sequences(r, lo, boundaries[i], count) < 0 ? -1
                                                                    : utf8_sequences(r, boundaries[i] + 1, hi, count);
        }
    }
    if (hi >= 0x80) {
        for (int i = 1; i <= 3; i++) {
            uint32_t m = ((uint32_t)1 << (6 * i)) - 1;
            if ((lo & ~m) == (hi & ~m)) {
                continue;
            }
            if (lo & m) {
                return utf8_sequences(r, lo, lo | m, count) < 0 ? -1 : utf8_sequences(r, (lo | m) + 1, hi, count);
            }
            if ((hi & m) != m) {
                return utf8_sequences(r, lo, (hi & ~m) - 1, count) < 0 ? -1 : utf8_sequences(r, hi & ~m, hi, count);
            }
        }
    }
    uint8_t first[4], last[4];
    int length = utf8_encode(lo, first);
    utf8_encode(hi, last);
    if (read_push(r, length) < 0) {
        return -1;
    }
    for (int i = 0; i < length; i++) {
        if (read_push(r, first[i]) < 0 || read_push(r, last[i]) < 0) {
            return -1;
        }
    }
    (*count)++;
    return 0;
}

/* A character set as `0 n sequences` (_program of _Chars, after _byte_sequences). */
static int read_emit_chars(Reader *r, Int32s *ranges) {
    ranges_normalise(ranges);
    Py_ssize_t at = r->out.size;
    int32_t count = 0;
    if (read_push(r, PROGRAM_CHARS) < 0 || read_push(r, 0) < 0) {
        return -1;
    }
    for (int64_t i = 0; i < ranges->size / 2; i++) {
        uint32_t lo = (uint32_t)ranges->data[2 * i], hi = (uint32_t)ranges->data[2 * i + 1];
        uint32_t parts[2][2] = {{lo, hi < 0xD7FF ? hi : 0xD7FF}, {lo > 0xE000 ? lo : 0xE000, hi}};
        for (int p = 0; p < 2; p++) { /* surrogates have no UTF-8 */
            if (parts[p][0] <= parts[p][1] && utf8_sequences(r, parts[p][0], parts[p][1], &count) < 0) {
                return -1;
            }
        }
    }
    r->out.data[at + 1] = count;
    return 0;
}

static int ranges_add(Reader *r, Int32s *ranges, int32_t lo, int32_t hi) {
    if (ints_push(ranges, 2, lo, hi, 0, 0) < 0) {
        r->no_memory = 1;
        return -1;
    }
    return 0;
}

static const int32_t READ_DIGIT[] = {0x30, 0x39};
static const int32_t READ_WORD[] = {0x30, 0x39, 0x41, 0x5A, 0x5F, 0x5F, 0x61, 0x7A};
static const int32_t READ_SPACE[] = {0x09,   0x0D,   0x20,   0x20,   0xA0,   0xA0,   0x1680, 0x1680, 0x2000, 0x200A,
                                     0x2028, 0x2029, 0x202F, 0x202F, 0x205F, 0x205F, 0x3000, 0x3000, 0xFEFF, 0xFEFF};

static inline int ascii_digit(Py_UCS4 c) {
    return c >= '0' && c <= '9';
}

static inline int ascii_hex(Py_UCS4 c) {
    return ascii_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* An escape at pos (the backslash): its ranges added to `ranges` (_Parser.escape). */
static int read_escape(Reader *r, Int32s *ranges) {
    r->pos++;
    Py_UCS4 c = read_peek(r);
    if (c == READ_END || c >= 0x80) { /* (non-ASCII: the reference asks str.isalnum) */
        return -1;
    }
    r->pos++;
    if (c != 0 && strchr("dwsDWS", (int)c) != NULL) {
        Py_UCS4 lower = c | 0x20;
        const int32_t *table = lower == 'd' ? READ_DIGIT : lower == 'w' ? READ_WORD : READ_SPACE;
        size_t n = lower == 'd' ? 1 : lower == 'w' ? 4 : 10;
        Int32s set = {0};
        for (size_t i = 0; i < n; i++) {
            if (ints_push(&set, 2, table[2 * i], table[2 * i + 1], 0, 0) < 0) {
                free(set.data);
                r->no_memory = 1;
                return -1;
            }
        }
        ranges_normalise(&set);
        if (c != lower && ranges_complement(&set) < 0) {
            free(set.data);
            r->no_memory = 1;
            return -1;
        }
        for (int64_t i = 0; i < set.size; i += 2) {
            if (ranges_add(r, ranges, set.data[i], set.data[i + 1]) < 0) {
                free(set.data);
                return -1;
            }
        }
        free(set.data);
        return 0;
    }
    static const char shorts[] = "ntrfv0";
    static const int32_t short_codes[] = {0x0A, 0x09, 0x0D, 0x0C, 0x0B, 0x00};
    const char *short_at = c != 0 ? strchr(shorts, (int)c) : NULL;
    if (short_at != NULL) {
        Py_UCS4 next = read_peek(r);
        if (c == '0' && next != READ_END && (next >= 0x80 || ascii_digit(next))) {
            return -1; /* a backreference, or a question for str.isdigit */
        }
        int32_t code = short_codes[short_at - shorts];
        return ranges_add(r, ranges, code, code);
    }
    if (c == 'x' || c == 'u') {
        Py_ssize_t start = r->pos, end = start + (c == 'x' ? 2 : 4);
        if (c == 'u' && read_peek(r) == '{') {
            start++;
            for (end = start; end < r->length && r->text[end] != '}'; end++) {
            }
            if (end >= r->length) {
                return -1;
            }
            r->pos = end + 1;
        } else if (end > r->length) {
            return -1;
        } else {
            r->pos = end;
        }
        uint32_t point = 0;
        for (Py_ssize_t i = start; i < end; i++) {
            Py_UCS4 h = r->text[i];
            if (!ascii_hex(h)) {
                return -1;
            }
            point = point * 16 + (uint32_t)(ascii_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
            if (point > READ_MAX_CODE) {
                return -1;
            }
        }
        return end > start ? ranges_add(r, ranges, (int32_t)point, (int32_t)point) : -1;
    }
    if (isalnum((int)c)) { /* backreferences, boundaries, properties, unknown letters: refused */
        return -1;
    }
    return ranges_add(r, ranges, (int32_t)c, (int32_t)c); /* punctuation stands for itself */
}

/* One class member at pos (_Parser.class_item) into `item` (emptied first). */
static int read_class_item(Reader *r, Int32s *item) {
    item->size = 0;
    Py_UCS4 c = r->text[r->pos];
    if (c == '\\' && read_at(r, r->pos + 1, 'b')) { /* backspace inside a class */
        r->pos += 2;
        return ranges_add(r, item, 8, 8);
    }
    if (c == '\\') {
        return read_escape(r, item);
    }
    r->pos++;
    return ranges_add(r, item, (int32_t)c, (int32_t)c);
}

static int read_class(Reader *r) {
    r->pos++;
    int negate = read_peek(r) == '^', first = 1, result = -1;
    r->pos += negate;
    Int32s ranges = {0}, low = {0}, high = {0};
    for (;;) {
        Py_UCS4 c = read_peek(r);
        if (c == READ_END) {
            goto done;
        }
        if (c == ']' && !first) {
            r->pos++;
            break;
        }
        first = 0;
        if (read_class_item(r, &low) < 0) {
            goto done;
        }
        if (read_peek(r) == '-' && r->pos + 1 < r->length && r->text[r->pos + 1] != ']') {
            r->pos++;
            if (read_class_item(r, &high) < 0 || low.size != 2 || high.size != 2 || low.data[0] != low.data[1] ||
                high.data[0] != high.data[1] || high.data[0] < low.data[0] ||
                ranges_add(r, &ranges, low.data[0], high.data[0]) < 0) {
                goto done;
            }
            continue;
        }
        for (int64_t i = 0; i < low.size; i += 2) {
            if (ranges_add(r, &ranges, low.data[i], low.data[i + 1]) < 0) {
                goto done;
            }
        }
    }
    ranges_normalise(&ranges);
    if (negate && ranges_complement(&ranges) < 0) {
        r->no_memory = 1;
        goto done;
    }
    result = read_emit_chars(r, &ranges);
done:
    free(ranges.data), free(low.data), free(high.data);
    return result;
}

/* `{n}`, `{m,n}`, `{m,}` at pos (_Parser.repetition_bounds): 1 with *low, *high (-1: none)
 * and *length; 0 when it is not one (a literal brace); -1 to ask the reference (counts of ten
 * digits or more). */
static int read_bounds(const Reader *r, int32_t *low, int32_t *high, Py_ssize_t *length) {
    Py_ssize_t end = r->pos + 1, comma = -1;
    for (; end < r->length && r->text[end] != '}'; end++) {
        comma = comma < 0 && r->text[end] == ',' ? end : comma;
    }
    if (end >= r->length) {
        return 0;
    }
    Py_ssize_t low_end = comma < 0 ? end : comma;
    int64_t values[2] = {0, -1};
    Py_ssize_t spans[2][2] = {{r->pos + 1, low_end}, {comma + 1, end}};
    for (int v = 0; v < (comma < 0 ? 1 : 2); v++) {
        if (v == 1 && spans[v][1] == spans[v][0]) {
            break; /* {m,}: no upper bound */
        }
        if (spans[v][1] == spans[v][0]) {
            return 0;
        }
        for (Py_ssize_t i = spans[v][0]; i < spans[v][1]; i++) {
            if (!ascii_digit(r->text[i])) {
                return 0;
            }
        }
        if (spans[v][1] - spans[v][0] > 9) {
            return -1;
        }
        values[v] = 0;
        for (Py_ssize_t i = spans[v][0]; i < spans[v][1]; i++) {
            values[v] = values[v] * 10 + (r->text[i] - '0');
        }
    }
    *low = (int32_t)values[0];
    *high = comma < 0 ? (int32_t)values[0] : (int32_t)values[1];
    *length = end + 1 - r->pos;
    return 1;
}

/* Quantifiers after the atom whose program starts at `atom_at` (_Parser.quantified). */
static int read_quantified(Reader *r, Py_ssize_t atom_at) {
    for (;;) {
        Py_UCS4 c = read_peek(r);
        int32_t low = 0, high = 1;
        Py_ssize_t length = 1;
        if (c == '*' || c == '+') {
            return -1;
        }
        if (c == '{') {
            int bounds = read_bounds(r, &low, &high, &length);
            if (bounds < 0 || (bounds == 1 && (high < 0 || high < low))) {
                return -1;
            }
            if (bounds == 0) {
                return 0;
            }
        } else if (c != '?') {
            return 0;
        }
        r->pos += length;
        if (read_peek(r) == '?') { /* lazy: the same language */
            r->pos++;
        } else if (read_peek(r) == '+') {
            return -1;
        }
        if (low > r->max_count || high > r->max_count || read_insert3(r, atom_at, PROGRAM_REPEAT, low, high) < 0) {
            return -1;
        }
    }
}

static int read_alternation(Reader *r, int depth);

static int read_group(Reader *r, int depth) {
    r->pos++;
    if (read_peek(r) == '?') {
        if (read_at(r, r->pos + 1, ':')) {
            r->pos += 2;
        } else if ((read_at(r, r->pos + 1, 'P') && read_at(r, r->pos + 2, '<')) ||
                   (read_at(r, r->pos + 1, '<') && !read_at(r, r->pos + 2, '=') && !read_at(r, r->pos + 2, '!'))) {
            Py_ssize_t close = r->pos;
            while (close < r->length && r->text[close] != '>') {
                close++;
            }
            if (close >= r->length) {
                return -1;
            }
            r->pos = close + 1;
        } else {
            return -1;
        }
    }
    if (read_alternation(r, depth + 1) < 0 || read_peek(r) != ')') {
        return -1;
    }
    r->pos++;
    return 0;
}

static int read_atom(Reader *r, int depth) {
    Py_UCS4 c = r->text[r->pos];
    int result;
    Int32s ranges = {0};
    switch (c) {
    case '(':
        return read_group(r, depth);
    case '[':
        return read_class(r);
    case '\\':
        result = read_escape(r, &ranges) < 0 ? -1 : read_emit_chars(r, &ranges);
        free(ranges.data);
        return result;
    case '.':
        r->pos++;
        result = ranges_add(r, &ranges, 0, 0xD7FF) < 0 || ranges_add(r, &ranges, 0xE000, READ_MAX_CODE) < 0
                     ? -1
                     : read_emit_chars(r, &ranges);
        free(ranges.data);
        return result;
    case '*':
    case '+':
    case '?':
    case '^':
    case '$':
        return -1;
    case '{': {
        int32_t low, high;
        Py_ssize_t length;
        if (read_bounds(r, &low, &high, &length) != 0) {
            return -1; /* nothing to repeat (or a question for the reference) */
        }
        break;
    }
    default:
        break;
    }
    r->pos++;
    result = ranges_add(r, &ranges, (int32_t)c, (int32_t)c) < 0 ? -1 : read_emit_chars(r, &ranges);
    free(ranges.data);
    return result;
}

static int read_sequence(Reader *r, int depth) {
    Py_ssize_t at = r->out.size;
    int32_t count = 0;
    if (read_push(r, PROGRAM_CONCAT) < 0 || read_push(r, 0) < 0) {
        return -1;
    }
    for (Py_UCS4 c; (c = read_peek(r)) != READ_END && c != '|' && c != ')'; count++) {
        if (c == '$' && r->pos == r->length - 1) {
            r->pos++; /* the trailing anchor: the match is anchored anyway */
            break;
        }
        Py_ssize_t atom_at = r->out.size;
        if (read_atom(r, depth) < 0 || read_quantified(r, atom_at) < 0) {
            return -1;
        }
    }
    read_close(r, at, count);
    return 0;
}

static int read_alternation(Reader *r, int depth) {
    Py_ssize_t at = r->out.size;
    int32_t count = 1;
    if (depth > 200 || read_push(r, PROGRAM_ALT) < 0 || read_push(r, 0) < 0 || read_sequence(r, depth) < 0) {
        return -1;
    }
    for (; read_peek(r) == '|'; count++) {
        r->pos++;
        if (read_sequence(r, depth) < 0) {
            return -1;
        }
    }
    read_close(r, at, count);
    return 0;
}

static PyObject *regex_program(PyObject *module, PyObject *args) {
    PyObject *pattern;
    int max_count;
    if (!PyArg_ParseTuple(args, "Ui", &pattern, &max_count)) {
        return NULL;
    }
    Py_UCS4 *text = PyUnicode_AsUCS4Copy(pattern);
    if (text == NULL) {
        return NULL;
    }
    Reader r = {.text = text, .length = PyUnicode_GetLength(pattern), .max_count = max_count};
    r.pos = read_peek(&r) == '^';
    int read = read_alternation(&r, 0) == 0 && r.pos >= r.length;
    PyMem_Free(text);
    PyObject *out = NULL;
    if (r.no_memory) {
        PyErr_NoMemory();
    } else if (!read) {
        out = Py_NewRef(Py_None);
    } else {
        char *data;
        out = new_bytes((Py_ssize_t)r.out.size * 4, &data);
        if (out != NULL) {
            memcpy(data, r.out.data, (size_t)r.out.size * 4);
        }
    }
    free(r.out.data);
    return out;
}
