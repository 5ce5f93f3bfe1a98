/* ------------------------------------------------------------------ raw controls in a grammar */

/* controls_in_strings(ebnf: str) -> bool: whether xgrammar's printed grammar may admit a raw
 * control character (0x00-0x1F) inside a JSON string; True wherever the reading cannot tell.
 * The rules are schemas.structure.controls_in_strings's, its Python reference (which
 * tests/test_schema_native.py compares this with); one pass over the text, nothing allocated.
 *
 *   "..."   a byte-string literal: no control in it, or JSON whitespace only;
 *   [...]   a character class: admits no control, or is JSON whitespace only ([ \n\r\t]);
 *           negated ([^...]): excludes every control;
 *   name(   a construct called by name (Regex, TagDispatch): unreadable here, True;
 *   other   rule names, operators, repetition bounds: [A-Za-z0-9_ \t\n\r:=|()*+?{},-].
 *
 * Escapes: \n \r \t \0 \b \f \v \a \e, \xHH, \uHHHH, \UHHHHHHHH, and a backslash before any
 * other ASCII punctuation (the character itself); any other escape is unreadable (True). */

enum { EBNF_UNREADABLE = -1 };

/* The code point at text[*at] (an escape or one UTF-8 character), *at moved past it and
 * *escaped set; EBNF_UNREADABLE for an escape this reading does not know or a cut text. */
static long ebnf_code(const unsigned char *text, Py_ssize_t length, Py_ssize_t *at, int *escaped) {
    Py_ssize_t i = *at;
    unsigned char c = text[i];
    *escaped = c == '\\';
    if (c != '\\') {
        int extra = c < 0x80 ? 0 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
        long code = extra == 0 ? c : c & (0x3F >> extra);
        if (i + extra >= length) {
            return EBNF_UNREADABLE;
        }
        for (int k = 1; k <= extra; k++) {
            code = (code << 6) | (text[i + k] & 0x3F);
        }
        *at = i + 1 + extra;
        return code;
    }
    if (i + 1 >= length) {
        return EBNF_UNREADABLE;
    }
    unsigned char e = text[i + 1];
    static const char named[] = "nrt0bfvae";
    static const long named_codes[] = {0x0A, 0x0D, 0x09, 0x00, 0x08, 0x0C, 0x0B, 0x07, 0x1B};
    const char *found = e != 0 ? strchr(named, e) : NULL;
    if (found != NULL) {
        *at = i + 2;
        return named_codes[found - named];
    }
    int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits > 0) {
        long code = 0;
        if (i + 2 + digits > length) {
            return EBNF_UNREADABLE;
        }
        for (int k = 0; k < digits; k++) {
            unsigned char d = text[i + 2 + k];
            int value = d >= '0' && d <= '9' ? d - '0' : d >= 'a' && d <= 'f' ? d - 'a' + 10
                      : d >= 'A' && d <= 'F' ? d - 'A' + 10 : -1;
            if (value < 0) {
                return EBNF_UNREADABLE;
            }
            code = code * 16 + value;
        }
        *at = i + 2 + digits;
        return code;
    }
    if (e < 0x80 && e > 0x20 && !isalnum(e)) {
        *at = i + 2;
        return e;
    }
    return EBNF_UNREADABLE;
}

static int ebnf_whitespace(long code) { return code == ' ' || code == '\t' || code == '\n' || code == '\r'; }

/* 1: may admit a control in a string; 0: cannot */
static int ebnf_controls(const unsigned char *text, Py_ssize_t length) {
    Py_ssize_t i = 0;
    while (i < length) {
        unsigned char c = text[i];
        int escaped;
        if (c == '"') { /* a literal */
            int control = 0, other = 0;
            for (i++;; ) {
                if (i >= length) {
                    return 1;
                }
                if (text[i] == '"') {
                    i++;
                    break;
                }
                long code = ebnf_code(text, length, &i, &escaped);
                if (code == EBNF_UNREADABLE) {
                    return 1;
                }
                control |= code < 0x20;
                other |= !ebnf_whitespace(code);
            }
            if (control && other) {
                return 1;
            }
        } else if (c == '[') { /* a character class */
            int negated = i + 1 < length && text[i + 1] == '^';
            uint32_t covered = 0; /* the controls the ranges hold, by bit */
            int other = 0;        /* a range that is not one JSON whitespace character */
            for (i += 1 + negated;; ) {
                if (i >= length) {
                    return 1;
                }
                if (text[i] == ']') {
                    i++;
                    break;
                }
                long lo = ebnf_code(text, length, &i, &escaped), hi = lo;
                if (lo == EBNF_UNREADABLE) {
                    return 1;
                }
                if (i + 1 < length && text[i] == '-' && text[i + 1] != ']') {
                    i++;
                    hi = ebnf_code(text, length, &i, &escaped);
                    if (hi == EBNF_UNREADABLE) {
                        return 1;
                    }
                }
                for (long code = lo; code <= hi && code < 0x20; code++) {
                    covered |= (uint32_t)1 << code;
                }
                other |= lo != hi || !ebnf_whitespace(lo);
            }
            if (negated ? covered != 0xFFFFFFFFu : covered != 0 && other) {
                return 1;
            }
        } else if (c == '(') {
            if (i > 0 && (isalnum(text[i - 1]) || text[i - 1] == '_')) {
                return 1; /* a construct called by name */
            }
            i++;
        } else if (c < 0x80 && (isalnum(c) || strchr("_ \t\n\r:=|()*+?{},-", c) != NULL) && c != 0) {
            i++;
        } else {
            return 1;
        }
    }
    return 0;
}

static PyObject *controls_in_strings(PyObject *module, PyObject *arg) {
    Py_ssize_t length;
    const char *text = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, &length) : NULL;
    if (text == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "controls_in_strings(ebnf): a str");
        }
        return NULL;
    }
    return PyBool_FromLong(ebnf_controls((const unsigned char *)text, length));
}
