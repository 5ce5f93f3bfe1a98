
/* checksum(buffer) -> int: the file format's checksum of a run of bytes (see
 * triemask.base.storage.checksum, the NumPy reference): the bytes as little-endian 64-bit words
 * (the last one padded with zeros), each word i mixed by a bijection of (word + (i + 1) * K1),
 * the results summed and the sum mixed with the length. A changed word always changes its
 * term, so any corruption inside one word is caught; the GIL is released, so pieces of a
 * file are checked on every core. */
#define CHECK_K1 0x9E3779B97F4A7C15ull
#define CHECK_K2 0xBF58476D1CE4E5B9ull
#define CHECK_K3 0x94D049BB133111EBull

static inline uint64_t check_term(uint64_t word, uint64_t salt) {
    uint64_t x = word + salt;
    x ^= x >> 31;
    x *= CHECK_K2;
    return x ^ (x >> 29);
}

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static PyObject *checksum(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    uint64_t n = (uint64_t)view.len, words = n / 8;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, i = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; i + 4 <= words; i += 4) { /* four independent sums: the multiplies overlap */
        s0 += check_term(load_le64(p + 8 * i), (i + 1) * CHECK_K1);
        s1 += check_term(load_le64(p + 8 * i + 8), (i + 2) * CHECK_K1);
        s2 += check_term(load_le64(p + 8 * i + 16), (i + 3) * CHECK_K1);
        s3 += check_term(load_le64(p + 8 * i + 24), (i + 4) * CHECK_K1);
    }
    for (; i < words; i++) {
        s0 += check_term(load_le64(p + 8 * i), (i + 1) * CHECK_K1);
    }
    if (n % 8) {
        unsigned char last[8] = {0};
        memcpy(last, p + 8 * words, n % 8);
        s0 += check_term(load_le64(last), (words + 1) * CHECK_K1);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    uint64_t h = s0 + s1 + s2 + s3 + n;
    h ^= h >> 33;
    h *= CHECK_K3;
    h ^= h >> 33;
    return PyLong_FromUnsignedLongLong(h);
}

/* spelled_edges(parent, byte, edge_offsets, edge_tokens, edge_dests, token_lengths, token_offsets,
 *               data, terminal, eos)
 * -> the index of the first edge whose token does not spell the path it takes (walking up from
 * its destination, one byte a step, must end at its source; an edge to final state n + v must
 * leave value v's node by an EOS token), or -1 when every one does (see
 * _automaton._check_edges_spell_values). Every index is checked before it is read, whatever the
 * arrays hold; the GIL is released. */
static PyObject *spelled_edges(PyObject *module, PyObject *args) {
    PyObject *objs[10];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &objs[7], &objs[8], &objs[9])) {
        return NULL;
    }
    static const Py_ssize_t sizes[10] = {4, 1, 4, 4, 4, 4, 8, 1, 4, 4};
    static const char *names[10] = {"parent",      "byte",          "edge_offsets", "edge_tokens", "edge_dests",
                                    "token_lengths", "token_offsets", "data",         "terminal",    "eos"};
    Py_buffer views[10];
    int held = 0;
    PyObject *result = NULL;
    for (; held < 10; held++) {
        if (get_array(objs[held], &views[held], sizes[held], names[held]) < 0) {
            goto done;
        }
    }
    const int32_t *parent = (const int32_t *)views[0].buf, *eo = (const int32_t *)views[2].buf;
    const uint8_t *byte = (const uint8_t *)views[1].buf, *data = (const uint8_t *)views[7].buf;
    const int32_t *tokens = (const int32_t *)views[3].buf, *dests = (const int32_t *)views[4].buf;
    const int32_t *lengths = (const int32_t *)views[5].buf;
    const int64_t *offsets = (const int64_t *)views[6].buf;
    const int32_t *terminal = (const int32_t *)views[8].buf, *eos = (const int32_t *)views[9].buf;
    Py_ssize_t n = views[0].shape[0], edges = views[3].shape[0], n_tokens = views[5].shape[0];
    Py_ssize_t n_data = views[7].shape[0], n_values = views[8].shape[0], n_eos = views[9].shape[0];
    if (views[1].shape[0] != n || views[2].shape[0] != n + 2 || views[4].shape[0] != edges ||
        views[6].shape[0] < n_tokens) {
        PyErr_SetString(PyExc_ValueError, "spelled_edges: arrays of inconsistent lengths");
        goto done;
    }
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 1; i < n && bad < 0; i++) { /* breadth-first: a parent comes first */
        if (parent[i] < 0 || parent[i] >= i) {
            bad = -2;
        }
    }
    for (Py_ssize_t node = 0; node < n && bad == -1; node++) {
        int32_t lo = eo[node], hi = eo[node + 1];
        if (lo < 0 || hi < lo || hi > edges) {
            bad = lo < 0 || lo > edges ? 0 : lo;
            break;
        }
        for (int32_t e = lo; e < hi; e++) {
            int32_t m = dests[e], t = tokens[e];
            if (m < 0) {
                bad = e;
                break;
            }
            if (m >= n) { /* a final state: EOS after the value ending here */
                int is_eos = 0;
                for (Py_ssize_t j = 0; j < n_eos; j++) {
                    is_eos |= eos[j] == t;
                }
                if (m - n >= n_values || terminal[m - n] != node || !is_eos) {
                    bad = e;
                    break;
                }
                continue;
            }
            if (t < 0 || t >= n_tokens || lengths[t] <= 0 || offsets[t] < 0 || offsets[t] + lengths[t] > n_data) {
                bad = e;
                break;
            }
            int64_t at = m;
            for (int64_t k = lengths[t] - 1; k >= 0; k--) {
                if (at <= 0 || byte[at] != data[offsets[t] + k]) {
                    at = -1;
                    break;
                }
                at = parent[at];
            }
            if (at != node) {
                bad = e;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (bad == -2) {
        PyErr_SetString(PyExc_ValueError, "spelled_edges: a parent that is not before its node");
        goto done;
    }
    result = PyLong_FromSsize_t(bad);
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
    }
    return result;
}

