/* ------------------------------------------------------------------ a node's edges */

typedef struct {
    const int32_t *tokens, *dests;
    int32_t count;
    const uint32_t *row; /* the whole row when the lazy cache holds it, else NULL */
} Edges;

/* The edges of trie node `node` (0 <= node < num_nodes): 0, or -1 when the lazy layout ran
 * out of memory building them. They stay valid until the next call. */
static inline int node_edges(const Kernel *self, int64_t node, Edges *out) {
    Lazy *z = self->lazy;
    if (z == NULL) {
        const int32_t *offsets = (const int32_t *)self->edge_offsets.buf;
        int32_t lo = offsets[node];
        out->tokens = (const int32_t *)self->edge_tokens.buf + lo;
        out->dests = (const int32_t *)self->edge_dests.buf + lo;
        out->count = offsets[node + 1] - lo;
        out->row = NULL;
        return 0;
    }
    Entry *e = z->buckets[bucket_of(z, (int32_t)node)];
    while (e != NULL && e->node != node) {
        e = e->chain;
    }
    if (e != NULL) {
        z->hits++;
        if (z->newest != e) {
            lazy_unlink(z, e);
            lazy_push_front(z, e);
        }
    } else {
        z->misses++;
        free(z->transient);
        z->transient = NULL;
        e = lazy_compute(self, (int32_t)node);
        if (e == NULL) {
            return -1;
        }
        lazy_insert(z, e);
    }
    out->tokens = e->listed ? e->data : NULL;
    out->dests = e->listed ? e->data + e->count : NULL;
    out->count = e->count;
    out->row = e->row;
    return 0;
}

/* Where `token` leads from a DAG's node whose edges are its row alone: the row says whether;
 * EOS leads to the node's final state; a text token's bytes, read up the token trie, walked
 * down the DAG say where (its length in lookups, as a binary search in the listed tokens). */
static int32_t row_edge_to(const Kernel *self, int32_t node, const Edges *e, int64_t token) {
    const Lazy *z = self->lazy;
    if (token < 0 || token >= 32 * (int64_t)self->width || !(e->row[token >> 5] >> (token & 31) & 1)) {
        return -1;
    }
    if (z->node_word[node] & LAZY_TERMINAL) {
        for (Py_ssize_t i = 0; i < z->n_eos; i++) {
            if (z->eos[i] == token) {
                return (int32_t)(self->num_nodes + lazy_value_index(z, node));
            }
        }
    }
    const TokenTrieTables *tok = z->tok;
    int32_t k = tok->token_node[token], depth = k > 0 ? (int32_t)(tok->byte_depth[k] >> 8) : 0;
    uint8_t stack_buffer[256], *spelled = depth <= 256 ? stack_buffer : (uint8_t *)malloc((size_t)depth);
    if (spelled == NULL) {
        return NO_MEMORY;
    }
    for (int32_t i = depth - 1; i >= 0; i--, k = tok->parent[k]) {
        spelled[i] = (uint8_t)(tok->byte_depth[k] & 0xFF);
    }
    int32_t v = depth > 0 ? node : -1;
    for (int32_t i = 0; i < depth && v >= 0; i++) {
        v = dag_child(z, v, spelled[i]);
    }
    if (spelled != stack_buffer) {
        free(spelled);
    }
    return v;
}

/* A row-only node's edges listed (tokens ascending, dests), in the kernel's scratch until the
 * next call, for edges() and pairs(); nothing to do for listed nodes. 0, or -1 for no memory. */
static int listed_edges(const Kernel *self, int64_t node, Edges *e) {
    Lazy *z = self->lazy;
    if (e->tokens != NULL) {
        return 0;
    }
    if (grow((void **)&z->listing, &z->listing_cap, 2 * (size_t)e->count + 1, sizeof(int32_t)) < 0) {
        return -1;
    }
    int32_t at = 0;
    for (Py_ssize_t w = 0; w < self->width && at < e->count; w++) {
        for (uint32_t bits = e->row[w]; bits != 0 && at < e->count; bits &= bits - 1) {
            int32_t token = (int32_t)(w * 32 + __builtin_ctz(bits)), to = row_edge_to(self, (int32_t)node, e, token);
            if (to == NO_MEMORY) {
                return -1;
            }
            z->listing[at] = token, z->listing[e->count + at] = to;
            at++;
        }
    }
    e->tokens = z->listing, e->dests = z->listing + e->count;
    return 0;
}

/* find_int32, find_int64: where `value` is in the ascending `items`, or -1 (one binary search,
 * for the two widths the kernel's sorted arrays come in). */
#define DEFINE_FIND(name, type)                                                                 \
    static inline Py_ssize_t name(const type *items, Py_ssize_t count, int64_t value) {        \
        Py_ssize_t lo = 0, hi = count;                                                          \
        while (lo < hi) {                                                                       \
            Py_ssize_t mid = lo + (hi - lo) / 2;                                                \
            if (items[mid] < value) {                                                           \
                lo = mid + 1;                                                                   \
            } else {                                                                            \
                hi = mid;                                                                       \
            }                                                                                   \
        }                                                                                       \
        return lo < count && items[lo] == value ? lo : -1;                                      \
    }
DEFINE_FIND(find_int32, int32_t)
DEFINE_FIND(find_int64, int64_t)
#undef DEFINE_FIND

/* Where a node's edge with `token` leads, or -1. */
static inline int32_t edge_to(const Edges *e, int64_t token) {
    Py_ssize_t at = find_int32(e->tokens, e->count, token);
    return at >= 0 ? e->dests[at] : -1;
}

static inline int32_t plain_next(const Kernel *self, int64_t state, int64_t token) {
    if (state < 0 || state >= self->num_nodes) {
        return -1; /* final and DEAD states allow nothing */
    }
    Edges e;
    if (node_edges(self, state, &e) < 0) {
        return NO_MEMORY;
    }
    return e.tokens != NULL ? edge_to(&e, token) : row_edge_to(self, (int32_t)state, &e, token);
}

/* The row of a node allowing a large part of the vocabulary, stored whole, or NULL. */
static inline const int32_t *dense_row(const Kernel *self, int64_t node, const Edges *e) {
    if (e->row != NULL) {
        return (const int32_t *)e->row;
    }
    if (self->lazy != NULL || e->count < self->dense_min) {
        return NULL;
    }
    Py_ssize_t at = find_int32((const int32_t *)self->dense_nodes.buf, self->dense_nodes.shape[0], node);
    return at >= 0 ? (const int32_t *)self->dense_rows.buf + at * self->width : NULL;
}

static inline void set_token_bits(int32_t *row, const int32_t *tokens, int32_t count) {
    uint32_t *words = (uint32_t *)row;
    for (int32_t i = 0; i < count; i++) {
        words[(uint32_t)tokens[i] >> 5] |= 1u << ((uint32_t)tokens[i] & 31);
    }
}

/* A row from the node's tokens (the automaton stores no bitmask words: setting one bit per
   allowed token costs what copying the words did, and saves their memory), or, for the few
   nodes allowing half a row's worth of tokens or more, a copy of the row stored whole.
   With `or_in`, the node's tokens are added to the row instead. 0, or -1 when the lazy
   layout ran out of memory. */
static inline int plain_fill(const Kernel *self, int32_t *row, int64_t node, int or_in) {
    Edges e;
    if (node < 0 || node >= self->num_nodes) {
        if (!or_in) {
            memset(row, 0, (size_t)self->width * sizeof(int32_t));
        }
        return 0;
    }
    if (node_edges(self, node, &e) < 0) {
        return -1;
    }
    const int32_t *whole = dense_row(self, node, &e);
    if (whole != NULL && or_in) {
        for (Py_ssize_t i = 0; i < self->width; i++) {
            row[i] |= whole[i];
        }
    } else if (whole != NULL) {
        memcpy(row, whole, (size_t)self->width * 4);
    } else {
        if (!or_in) {
            memset(row, 0, (size_t)self->width * sizeof(int32_t));
        }
        set_token_bits(row, e.tokens, e.count);
    }
    return 0;
}

/* ------------------------------------------------------------------ an updated set's kernel */

typedef struct {
    int64_t base, delta; /* the parts' states (-1: DEAD) */
    const int32_t *cut;  /* the tokens the base node lost, ascending (cut_count of them) */
    int32_t cut_count;
} Parts;

static inline Parts parts_of(const Patch *p, int64_t state) {
    Parts out = {-1, -1, NULL, 0};
    if (state < p->base_states) { /* (DEAD included) */
        out.base = state;
    } else if (state < p->base_states + p->delta_states) {
        out.delta = state - p->base_states;
    } else {
        out.delta = state - p->base_states - p->delta_states;
        out.base = ((const int32_t *)p->partner.buf)[out.delta];
    }
    if (out.base >= 0 && out.base < ((const Kernel *)p->base)->num_nodes &&
        (p->cut[out.base >> 6] >> (out.base & 63) & 1)) {
        const int32_t *offsets = (const int32_t *)p->offsets.buf;
        Py_ssize_t k = find_int32((const int32_t *)p->nodes.buf, p->nodes.shape[0], out.base);
        out.cut = (const int32_t *)p->tokens.buf + offsets[k]; /* (a set bit is a listed node) */
        out.cut_count = offsets[k + 1] - offsets[k];
    }
    return out;
}

/* The state of the pair (base, delta), either DEAD (see Patch): both at nodes, the base one is
 * the delta node's partner (the same prefix), and a delta final state has no base part (a
 * value is in one part only). */
static inline int32_t joined(const Patch *p, int32_t base, int32_t delta) {
    if (delta < 0) {
        return base;
    }
    if (base < 0 || delta >= (int64_t)p->partner.shape[0]) {
        return (int32_t)(p->base_states + delta);
    }
    return (int32_t)(p->base_states + p->delta_states + delta);
}

static int32_t patched_next(const Kernel *self, int64_t state, int64_t token) {
    const Patch *p = self->patch;
    Parts at = parts_of(p, state);
    int32_t base = plain_next((const Kernel *)p->base, at.base, token);
    int32_t delta = p->delta != NULL ? plain_next((const Kernel *)p->delta, at.delta, token) : -1;
    if (base == NO_MEMORY || delta == NO_MEMORY) { /* (the parts are eager: never) */
        return NO_MEMORY;
    }
    if (base >= 0 && at.cut_count > 0 && find_int32(at.cut, at.cut_count, token) >= 0) {
        base = -1;
    }
    return joined(p, base, delta);
}

static int patched_fill(const Kernel *self, int32_t *row, int64_t state) {
    const Patch *p = self->patch;
    Parts at = parts_of(p, state);
    if (plain_fill((const Kernel *)p->base, row, at.base, 0) < 0) {
        return -1;
    }
    uint32_t *words = (uint32_t *)row;
    for (int32_t i = 0; i < at.cut_count; i++) {
        words[(uint32_t)at.cut[i] >> 5] &= ~(1u << ((uint32_t)at.cut[i] & 31));
    }
    return p->delta != NULL ? plain_fill((const Kernel *)p->delta, row, at.delta, 1) : 0;
}

static inline int32_t next_of(const Kernel *self, int64_t state, int64_t token) {
    return self->patch != NULL ? patched_next(self, state, token) : plain_next(self, state, token);
}

static inline int fill_one(const Kernel *self, int32_t *row, int64_t state) {
    return self->patch != NULL ? patched_fill(self, row, state) : plain_fill(self, row, state, 0);
}

static int valid_state(const Kernel *self, int64_t state) {
    return state >= -1 && state < self->num_states;
}

static PyObject *Kernel_next(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t state, token;
    if (nargs != 2 || !exact_int(args[0], &state) || !exact_int(args[1], &token) || !valid_state(self, state)) {
        Py_RETURN_NONE;
    }
    int32_t following = next_of(self, state, token);
    return following == NO_MEMORY ? PyErr_NoMemory() : PyLong_FromLong(following);
}

/* The per-step fill spends most of its time in NumPy's buffer export (about 0.3 us, as
 * much as writing the row), so Kernel.fill reads an exact numpy.ndarray's header
 * directly: the layout of NumPy's PyArrayObject_fields, stable since NumPy 1.7 and part of
 * its ABI. The mirror is trusted only after enable_ndarray_headers() has checked it on
 * probe arrays built by Python (address, shape, strides and flags read both ways), and
 * only for arrays whose dtype object is the probe's int32 singleton; anything else takes
 * the buffer protocol. It is used with the GIL held for the whole call only. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ArrayHeader;

enum { ARRAY_C_CONTIGUOUS = 0x0001, ARRAY_ALIGNED = 0x0100, ARRAY_WRITEABLE = 0x0400 };
static PyTypeObject *ndarray_type = NULL; /* set once the mirror is checked */
static PyObject *int32_descr = NULL;

static int header_matches(PyObject *probe, int writable, int contiguous) {
    Py_buffer view;
    if (PyObject_GetBuffer(probe, &view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    const ArrayHeader *h = (const ArrayHeader *)probe;
    int ok = h->data == (char *)view.buf && h->nd == view.ndim && view.ndim == 2 && view.itemsize == 4 &&
             ((h->flags & ARRAY_WRITEABLE) != 0) == writable && ((h->flags & ARRAY_C_CONTIGUOUS) != 0) == contiguous &&
             (view.readonly == 0) == writable;
    for (int i = 0; ok && i < 2; i++) {
        ok = h->dimensions[i] == view.shape[i] && h->strides[i] == view.strides[i];
    }
    PyBuffer_Release(&view);
    return ok;
}

/* enable_ndarray_headers(writable, readonly, transposed) -> bool: three int32 2-D probes
 * (a fresh writable array, a read-only one, a non-contiguous view), all of one dtype. */
static PyObject *enable_ndarray_headers(PyObject *module, PyObject *args) {
    PyObject *writable, *readonly, *transposed;
    if (!PyArg_ParseTuple(args, "OOO", &writable, &readonly, &transposed)) {
        return NULL;
    }
    PyTypeObject *type = Py_TYPE(writable);
    if (ndarray_type != NULL || Py_TYPE(readonly) != type || Py_TYPE(transposed) != type ||
        type->tp_basicsize < (Py_ssize_t)sizeof(ArrayHeader)) {
        return PyBool_FromLong(ndarray_type != NULL);
    }
    const ArrayHeader *w = (const ArrayHeader *)writable;
    if (!header_matches(writable, 1, 1) || !header_matches(readonly, 0, 1) || !header_matches(transposed, 1, 0) ||
        !(w->flags & ARRAY_ALIGNED) || w->descr != ((const ArrayHeader *)readonly)->descr || w->descr == NULL) {
        Py_RETURN_FALSE;
    }
    Py_INCREF(type);
    Py_INCREF(w->descr);
    ndarray_type = type;
    int32_descr = w->descr;
    Py_RETURN_TRUE;
}

/* A writable, C-contiguous 2-D int32 buffer of the automaton's width. */
static int get_bitmask(const Kernel *self, PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS) < 0) {
        PyErr_Clear();
        return 0;
    }
    /* int32: "i" (or "l" where C long is 32 bits), possibly after a byte-order mark */
    const char *format = view->format == NULL ? "B" : view->format;
    if (*format == '=' || *format == '<' || *format == '@') {
        format++;
    }
    if (view->ndim != 2 || view->itemsize != 4 || (strcmp(format, "i") != 0 && strcmp(format, "l") != 0) ||
        view->readonly || view->shape[1] != self->width || view->strides[1] != 4 ||
        view->strides[0] != 4 * view->shape[1]) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* Fill row `row` of `target` with the mask of `state` (a valid state): 1 when done, 0 to
 * defer (a buffer the kernel does not take, a row outside it), -1 with MemoryError set. */
static int fill_into(const Kernel *self, PyObject *target, int64_t row, int64_t state) {
    if (Py_TYPE(target) == ndarray_type) {
        const ArrayHeader *h = (const ArrayHeader *)target;
        const int needed = ARRAY_C_CONTIGUOUS | ARRAY_ALIGNED | ARRAY_WRITEABLE;
        if (h->descr == int32_descr && h->nd == 2 && (h->flags & needed) == needed && h->dimensions[1] == self->width) {
            if (row < 0 || row >= h->dimensions[0]) {
                return 0;
            }
            return fill_one(self, (int32_t *)h->data + row * self->width, state) < 0 ? (PyErr_NoMemory(), -1) : 1;
        }
    }
    Py_buffer view;
    if (!get_bitmask(self, target, &view)) {
        return 0;
    }
    int done = row >= 0 && row < view.shape[0];
    if (done && fill_one(self, (int32_t *)view.buf + row * self->width, state) < 0) {
        PyErr_NoMemory();
        done = -1;
    }
    PyBuffer_Release(&view);
    return done;
}

static PyObject *Kernel_fill(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t row, state;
    if (nargs != 3 || !exact_int(args[1], &row) || !exact_int(args[2], &state) || !valid_state(self, state)) {
        Py_RETURN_NONE;
    }
    int done = fill_into(self, args[0], row, state);
    if (done < 0) {
        return NULL;
    }
    if (!done) {
        Py_RETURN_NONE;
    }
    Py_RETURN_TRUE;
}

/* A sequence of integers as a C int64 array: a list or tuple of exact ints (copied), or a
   1-D C-contiguous int64 buffer (viewed). Returns 0 to defer to Python. */
typedef struct {
    const int64_t *data;
    Py_ssize_t size;
    int64_t *owned;
    Py_buffer view;
    int has_view;
} Ints;

static int get_ints(PyObject *obj, Ints *out) {
    out->owned = NULL;
    out->has_view = 0;
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        PyObject **items = PySequence_Fast_ITEMS(obj);
        out->owned = (int64_t *)PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
        if (out->owned == NULL) {
            PyErr_Clear();
            return 0;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!exact_int(items[i], &out->owned[i])) {
                PyMem_Free(out->owned);
                out->owned = NULL;
                return 0;
            }
        }
        out->data = out->owned;
        out->size = n;
        return 1;
    }
    if (PyObject_GetBuffer(obj, &out->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *format = out->view.format == NULL ? "B" : out->view.format;
    if (*format == '=' || *format == '<' || *format == '@') {
        format++;
    }
    if (out->view.ndim != 1 || out->view.itemsize != 8 || (strcmp(format, "l") != 0 && strcmp(format, "q") != 0)) {
        PyBuffer_Release(&out->view);
        return 0;
    }
    out->has_view = 1;
    out->data = (const int64_t *)out->view.buf;
    out->size = out->view.shape[0];
    return 1;
}

static void release_ints(Ints *ints) {
    if (ints->owned != NULL) {
        PyMem_Free(ints->owned);
    }
    if (ints->has_view) {
        PyBuffer_Release(&ints->view);
    }
}

static PyObject *Kernel_fill_batch(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer mask;
    Ints states, rows;
    int have_rows = 0;
    if (nargs != 3) {
        Py_RETURN_NONE;
    }
    if (!get_bitmask(self, args[0], &mask)) {
        Py_RETURN_NONE;
    }
    if (!get_ints(args[1], &states)) {
        PyBuffer_Release(&mask);
        Py_RETURN_NONE;
    }
    if (args[2] != Py_None) {
        if (!get_ints(args[2], &rows)) {
            PyBuffer_Release(&mask);
            release_ints(&states);
            Py_RETURN_NONE;
        }
        have_rows = 1;
    }
    Py_ssize_t batch = states.size, height = mask.shape[0];
    const int64_t *s = states.data;
    const int64_t *r = have_rows ? rows.data : NULL;
    int ok = (have_rows ? rows.size == batch : batch <= height);
    for (Py_ssize_t i = 0; ok && i < batch; i++) {
        ok = valid_state(self, s[i]) && (!have_rows || (r[i] >= 0 && r[i] < height));
    }
    if (ok && have_rows && batch > 1) { /* rows must be distinct, as the reference requires */
        unsigned char *seen = (unsigned char *)PyMem_Calloc((size_t)height, 1);
        if (seen == NULL) {
            PyErr_Clear();
            ok = 0;
        }
        for (Py_ssize_t i = 0; ok && i < batch; i++) {
            ok = !seen[r[i]];
            seen[r[i]] = 1;
        }
        PyMem_Free(seen);
    }
    int failed = 0;
    if (ok) {
        int32_t *base = (int32_t *)mask.buf;
        PyThreadState *saved = self->lazy ? NULL : PyEval_SaveThread(); /* the lazy cache needs the GIL */
        for (Py_ssize_t i = 0; i < batch && !failed; i++) {
            failed = fill_one(self, base + (have_rows ? r[i] : i) * self->width, s[i]) < 0;
        }
        if (saved) {
            PyEval_RestoreThread(saved);
        }
    }
    PyBuffer_Release(&mask);
    release_ints(&states);
    if (have_rows) {
        release_ints(&rows);
    }
    if (failed) {
        return PyErr_NoMemory();
    }
    if (!ok) {
        Py_RETURN_NONE;
    }
    Py_RETURN_TRUE;
}

static PyObject *Kernel_next_batch(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    Ints states, tokens;
    Py_buffer out;
    if (nargs != 3) {
        Py_RETURN_NONE;
    }
    if (!get_ints(args[0], &states)) {
        Py_RETURN_NONE;
    }
    if (!get_ints(args[1], &tokens)) {
        release_ints(&states);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(args[2], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        release_ints(&states);
        release_ints(&tokens);
        Py_RETURN_NONE;
    }
    Py_ssize_t batch = states.size;
    const int64_t *s = states.data, *t = tokens.data;
    int ok = out.ndim == 1 && out.itemsize == 4 && tokens.size == batch && out.shape[0] == batch;
    for (Py_ssize_t i = 0; ok && i < batch; i++) {
        ok = valid_state(self, s[i]);
    }
    int failed = 0;
    if (ok) {
        int32_t *o = (int32_t *)out.buf;
        PyThreadState *saved = self->lazy ? NULL : PyEval_SaveThread(); /* the lazy cache needs the GIL */
        for (Py_ssize_t i = 0; i < batch && !failed; i++) {
            o[i] = next_of(self, s[i], t[i]);
            failed = o[i] == NO_MEMORY;
        }
        if (saved) {
            PyEval_RestoreThread(saved);
        }
    }
    release_ints(&states);
    release_ints(&tokens);
    PyBuffer_Release(&out);
    if (failed) {
        return PyErr_NoMemory();
    }
    if (!ok) {
        Py_RETURN_NONE;
    }
    Py_RETURN_TRUE;
}


/* The two answers of pairs(): bytearrays for `total` rows (int64) and tokens (int32). 0, or -1
 * with an error set (both outputs NULL then). */
static int new_pairs(int64_t total, PyObject **rows_out, int64_t **rows, PyObject **tokens_out, int32_t **tokens) {
    char *rows_data, *tokens_data;
    *rows_out = new_bytes(total * 8, &rows_data);
    *tokens_out = *rows_out != NULL ? new_bytes(total * 4, &tokens_data) : NULL;
    if (*tokens_out == NULL) {
        Py_CLEAR(*rows_out);
        return -1;
    }
    *rows = (int64_t *)rows_data, *tokens = (int32_t *)tokens_data;
    return 0;
}

/* An updated state's tokens: its base part's, its cut tokens and its delta part's, three
 * ascending lists (empty where a part is DEAD, final or absent). */
static Parts patched_edges(const Patch *p, int64_t state, Edges *base, Edges *delta) {
    Parts at = parts_of(p, state);
    const Kernel *b = (const Kernel *)p->base, *d = (const Kernel *)p->delta;
    base->count = delta->count = 0;
    if (at.base >= 0 && at.base < b->num_nodes) {
        node_edges(b, at.base, base); /* (eager: cannot fail) */
    }
    if (d != NULL && at.delta >= 0 && at.delta < d->num_nodes) {
        node_edges(d, at.delta, delta);
    }
    return at;
}

/* pairs() of an updated set: each row's base tokens less its cut ones, merged with its delta
 * tokens, duplicates once. */
static PyObject *patched_pairs(Kernel *self, Ints *states) {
    const Patch *p = self->patch;
    const int64_t *s = states->data;
    int64_t total = 0;
    Edges a, b;
    for (Py_ssize_t i = 0; i < states->size; i++) {
        if (!valid_state(self, s[i])) {
            Py_RETURN_NONE;
        }
        patched_edges(p, s[i], &a, &b);
        total += a.count + b.count;
    }
    int64_t *rows;
    int32_t *tokens;
    PyObject *result = NULL, *rows_out, *tokens_out;
    if (new_pairs(total, &rows_out, &rows, &tokens_out, &tokens) == 0) {
        int64_t at = 0;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < states->size; i++) {
            Parts parts = patched_edges(p, s[i], &a, &b);
            int32_t x = 0, y = 0, c = 0;
            while (x < a.count || y < b.count) {
                if (x < a.count) { /* (a cut token is skipped: its base edge is gone) */
                    while (c < parts.cut_count && parts.cut[c] < a.tokens[x]) {
                        c++;
                    }
                    if (c < parts.cut_count && parts.cut[c] == a.tokens[x]) {
                        x++;
                        continue;
                    }
                }
                int32_t token;
                if (y == b.count || (x < a.count && a.tokens[x] < b.tokens[y])) {
                    token = a.tokens[x++];
                } else if (x == a.count || b.tokens[y] < a.tokens[x]) {
                    token = b.tokens[y++];
                } else {
                    token = a.tokens[x++];
                    y++;
                }
                rows[at] = i;
                tokens[at++] = token;
            }
        }
        Py_END_ALLOW_THREADS
        if (PyByteArray_Resize(rows_out, at * 8) == 0 && PyByteArray_Resize(tokens_out, at * 4) == 0) {
            result = PyTuple_Pack(2, rows_out, tokens_out);
        }
    }
    Py_XDECREF(rows_out);
    Py_XDECREF(tokens_out);
    return result;
}

/* pairs(states) -> (rows int64, tokens int32) as bytearrays: every allowed (row, token) of
 * a batch of states (allowed_token_pairs), or None to defer. */
static PyObject *Kernel_pairs(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    Ints states;
    if (nargs != 1 || !get_ints(args[0], &states)) {
        Py_RETURN_NONE;
    }
    if (self->patch != NULL) {
        PyObject *found = patched_pairs(self, &states);
        release_ints(&states);
        return found;
    }
    const int64_t *s = states.data;
    int64_t total = 0;
    Edges e;
    for (Py_ssize_t i = 0; i < states.size; i++) {
        if (!valid_state(self, s[i])) {
            release_ints(&states);
            Py_RETURN_NONE;
        }
        if (s[i] >= 0 && s[i] < self->num_nodes) {
            if (node_edges(self, s[i], &e) < 0) {
                release_ints(&states);
                return PyErr_NoMemory();
            }
            total += e.count;
        }
    }
    int64_t *rows;
    int32_t *tokens;
    PyObject *result = NULL, *rows_out, *tokens_out;
    if (new_pairs(total, &rows_out, &rows, &tokens_out, &tokens) == 0) {
        int failed = 0;
        PyThreadState *saved = self->lazy ? NULL : PyEval_SaveThread(); /* the lazy cache needs the GIL */
        int64_t at = 0;
        for (Py_ssize_t i = 0; i < states.size && !failed; i++) {
            if (s[i] >= 0 && s[i] < self->num_nodes) {
                /* a lazy node evicted since the count is rebuilt: the same edges again */
                failed = node_edges(self, s[i], &e) < 0 || listed_edges(self, s[i], &e) < 0;
                if (!failed) {
                    memcpy(tokens + at, e.tokens, (size_t)e.count * sizeof(int32_t));
                    for (int32_t k = 0; k < e.count; k++) {
                        rows[at++] = i;
                    }
                }
            }
        }
        if (saved) {
            PyEval_RestoreThread(saved);
        }
        result = failed ? PyErr_NoMemory() : PyTuple_Pack(2, rows_out, tokens_out);
    }
    release_ints(&states);
    Py_XDECREF(rows_out);
    Py_XDECREF(tokens_out);
    return result;
}



/* updated_kernel(base, delta_or_None, nodes, offsets, tokens, partner, num_states) -> Kernel:
 * an UpdatedTrieAutomaton's lookups (see Patch). The parts are eager Kernels of one width;
 * every cut node, offset and token (ascending per node) and every partner is checked here. */
static PyObject *updated_kernel(PyObject *module, PyObject *args) {
    PyObject *base, *delta, *objs[4];
    long long num_states;
    if (!PyArg_ParseTuple(args, "O!OOOOOL", &KernelType, &base, &delta, &objs[0], &objs[1], &objs[2], &objs[3],
                          &num_states)) {
        return NULL;
    }
    const Kernel *b = (const Kernel *)base, *d = delta == Py_None ? NULL : (const Kernel *)delta;
    if (delta != Py_None && !PyObject_TypeCheck(delta, &KernelType)) {
        PyErr_SetString(PyExc_TypeError, "updated_kernel: delta must be a Kernel or None");
        return NULL;
    }
    int64_t delta_states = d != NULL ? d->num_states : 0, delta_nodes = d != NULL ? d->num_nodes : 0;
    if (b->lazy || b->patch || (d != NULL && (d->lazy || d->patch || d->width != b->width)) ||
        num_states != b->num_states + delta_states + delta_nodes || num_states >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "updated_kernel: parts of another layout, width or size");
        return NULL;
    }
    Kernel *self = (Kernel *)KernelType.tp_alloc(&KernelType, 0);
    if (self == NULL) {
        return NULL;
    }
    Patch *p = (Patch *)PyMem_Calloc(1, sizeof(Patch));
    if (p == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->patch = p;
    Py_INCREF(base);
    p->base = base;
    if (d != NULL) {
        Py_INCREF(delta);
        p->delta = delta;
    }
    Py_buffer *views[4] = {&p->nodes, &p->offsets, &p->tokens, &p->partner};
    static const char *names[4] = {"nodes", "offsets", "tokens", "partner"};
    for (int i = 0; i < 4; i++) {
        if (get_array(objs[i], views[i], 4, names[i]) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        p->held = i + 1;
    }
    const int32_t *nodes = (const int32_t *)p->nodes.buf, *offsets = (const int32_t *)p->offsets.buf;
    const int32_t *tokens = (const int32_t *)p->tokens.buf, *partner = (const int32_t *)p->partner.buf;
    Py_ssize_t count = p->nodes.shape[0], cut = p->tokens.shape[0];
    int bad = p->offsets.shape[0] != count + 1 || offsets[0] != 0 || offsets[count] != cut ||
              p->partner.shape[0] != delta_nodes;
    for (Py_ssize_t i = 0; !bad && i < count; i++) {
        bad = nodes[i] < 0 || nodes[i] >= b->num_nodes || (i > 0 && nodes[i] <= nodes[i - 1]) ||
              offsets[i + 1] <= offsets[i];
    }
    for (Py_ssize_t i = 0; !bad && i < count; i++) {
        for (int32_t j = offsets[i]; !bad && j < offsets[i + 1]; j++) {
            bad = tokens[j] < 0 || (int64_t)tokens[j] >= 32 * (int64_t)b->width ||
                  (j > offsets[i] && tokens[j] <= tokens[j - 1]);
        }
    }
    for (Py_ssize_t i = 0; !bad && i < delta_nodes; i++) {
        bad = partner[i] < -1 || partner[i] >= b->num_nodes;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "updated_kernel: cut nodes, offsets, tokens or partners out of range");
        Py_DECREF(self);
        return NULL;
    }
    p->base_states = b->num_states;
    p->delta_states = delta_states;
    p->cut = (uint64_t *)PyMem_Calloc((size_t)(b->num_nodes / 64 + 1), 8);
    if (p->cut == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        p->cut[nodes[i] >> 6] |= (uint64_t)1 << (nodes[i] & 63);
    }
    self->num_nodes = 0; /* (no node of its own: every lookup goes to the parts) */
    self->num_states = num_states;
    self->width = b->width;
    self->dense_min = INT64_MAX;
    return (PyObject *)self;
}
