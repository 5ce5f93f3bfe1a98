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
    out->tokens = e->data;
    out->dests = e->data + e->count;
    out->count = e->count;
    out->row = e->row;
    return 0;
}

static inline int32_t next_of(const Kernel *self, int64_t state, int64_t token) {
    if (state < 0 || state >= self->num_nodes) {
        return -1; /* final and DEAD states allow nothing */
    }
    Edges e;
    if (node_edges(self, state, &e) < 0) {
        return NO_MEMORY;
    }
    int32_t lo = 0, hi = e.count;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (e.tokens[mid] < token) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < e.count && e.tokens[lo] == token ? e.dests[lo] : -1;
}

/* A row from the node's tokens (the automaton stores no bitmask words: setting one bit per
   allowed token costs what copying the words did, and saves their memory), or, for the few
   nodes allowing half a row's worth of tokens or more, a copy of the row stored whole.
   0, or -1 when the lazy layout ran out of memory. */
static inline int fill_one(const Kernel *self, int32_t *row, int64_t node) {
    Edges e;
    if (node < 0 || node >= self->num_nodes) {
        memset(row, 0, (size_t)self->width * sizeof(int32_t));
        return 0;
    }
    if (node_edges(self, node, &e) < 0) {
        return -1;
    }
    if (e.row != NULL) {
        memcpy(row, e.row, (size_t)self->width * 4);
        return 0;
    }
    if (self->lazy == NULL && e.count >= self->dense_min) {
        /* a node allowing a large part of the vocabulary: its row is stored whole */
        const int32_t *dense = (const int32_t *)self->dense_nodes.buf;
        Py_ssize_t lo = 0, hi = self->dense_nodes.shape[0];
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (dense[mid] < node) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if (lo < self->dense_nodes.shape[0] && dense[lo] == node) {
            memcpy(row, (const int32_t *)self->dense_rows.buf + lo * self->width, (size_t)self->width * 4);
            return 0;
        }
    }
    memset(row, 0, (size_t)self->width * sizeof(int32_t));
    uint32_t *words = (uint32_t *)row;
    for (int32_t i = 0; i < e.count; i++) {
        words[(uint32_t)e.tokens[i] >> 5] |= 1u << ((uint32_t)e.tokens[i] & 31);
    }
    return 0;
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


/* pairs(states) -> (rows int64, tokens int32) as bytearrays: every allowed (row, token) of
 * a batch of states (allowed_token_pairs), or None to defer. */
static PyObject *Kernel_pairs(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    Ints states;
    if (nargs != 1 || !get_ints(args[0], &states)) {
        Py_RETURN_NONE;
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
    char *rows_data, *tokens_data;
    PyObject *result = NULL, *tokens_out = NULL, *rows_out = new_bytes(total * 8, &rows_data);
    if (rows_out != NULL) {
        tokens_out = new_bytes(total * 4, &tokens_data);
    }
    if (rows_out != NULL && tokens_out != NULL) {
        int64_t *rows = (int64_t *)rows_data;
        int32_t *tokens = (int32_t *)tokens_data;
        int failed = 0;
        PyThreadState *saved = self->lazy ? NULL : PyEval_SaveThread(); /* the lazy cache needs the GIL */
        int64_t at = 0;
        for (Py_ssize_t i = 0; i < states.size && !failed; i++) {
            if (s[i] >= 0 && s[i] < self->num_nodes) {
                /* a lazy node evicted since the count is rebuilt: the same edges again */
                failed = node_edges(self, s[i], &e) < 0;
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

