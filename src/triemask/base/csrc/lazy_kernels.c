/* ------------------------------------------------------------------ lazy kernels */

/* lazy_kernel(node_byte u8, node_word u16, child_blocks i32, terminal_blocks i32,
 *             terminal_values i32, tok_children i32, tok_byte u8, tok_offsets i32, tok_ids i32,
 *             eos_ids i32, num_nodes, num_states, width, dense_min, cache_bytes) -> Kernel
 * Every array is checked here (counts against the samples, children after their parent,
 * ids in range), so that no lookup can leave them whatever they hold. */
static PyObject *lazy_kernel(PyObject *module, PyObject *args) {
    PyObject *objs[10];
    long long num_nodes, num_states, dense_min, cache_bytes;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOLLnLL", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5],
                          &objs[6], &objs[7], &objs[8], &objs[9], &num_nodes, &num_states, &width, &dense_min,
                          &cache_bytes)) {
        return NULL;
    }
    static const Py_ssize_t sizes[10] = {1, 2, 4, 4, 4, 4, 1, 4, 4, 4};
    static const char *names[10] = {"node_byte",    "node_word", "child_blocks", "terminal_blocks", "terminal_values",
                                    "tok_children", "tok_byte",  "tok_offsets",  "tok_ids",         "eos_ids"};
    Kernel *self = (Kernel *)KernelType.tp_alloc(&KernelType, 0);
    if (self == NULL) {
        return NULL;
    }
    Lazy *z = (Lazy *)PyMem_Calloc(1, sizeof(Lazy));
    if (z == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->lazy = z;
    Py_buffer eos;
    for (int i = 0; i < 10; i++) {
        if (get_array(objs[i], i < 9 ? &z->views[i] : &eos, sizes[i], names[i]) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        if (i < 9) {
            z->held = i + 1;
        }
    }
    z->node_byte = (const uint8_t *)z->views[0].buf;
    z->node_word = (const uint16_t *)z->views[1].buf;
    z->child_blocks = (const int32_t *)z->views[2].buf;
    z->terminal_blocks = (const int32_t *)z->views[3].buf;
    z->terminal_values = (const int32_t *)z->views[4].buf;
    z->tok_children = (const int32_t *)z->views[5].buf;
    z->tok_byte = (const uint8_t *)z->views[6].buf;
    z->tok_offsets = (const int32_t *)z->views[7].buf;
    z->tok_ids = (const int32_t *)z->views[8].buf;
    Py_ssize_t n = z->views[0].shape[0], blocks = (n + 63) / 64, nt = z->views[6].shape[0];
    Py_ssize_t values = z->views[4].shape[0], n_ids = z->views[8].shape[0];
    uint64_t limit = 32 * (uint64_t)width; /* a token's bit lies in the row */
    int bad = n < 1 || n != num_nodes || width < 1 || width > ((int64_t)1 << 26) || dense_min < 1 ||
              cache_bytes < 0 || num_states != num_nodes + values || n >= INT32_MAX - values ||
              z->views[1].shape[0] != n || z->views[2].shape[0] != blocks + 1 ||
              z->views[3].shape[0] != blocks + 1 || nt < 1 || z->views[5].shape[0] != nt + 1 ||
              z->views[7].shape[0] != nt + 1;
    int64_t first = 1, terminals = 0;
    for (Py_ssize_t a = 0; !bad && a < n; a++) {
        if (a % 64 == 0) {
            bad |= z->child_blocks[a / 64] != first || z->terminal_blocks[a / 64] != terminals;
        }
        int64_t count = z->node_word[a] & LAZY_COUNT;
        bad |= count > 256 || (count > 0 && (first <= a || first + count > n));
        first += count;
        terminals += (z->node_word[a] & LAZY_TERMINAL) != 0;
    }
    bad |= bad || first != n || z->child_blocks[blocks] != n || terminals != values ||
           z->terminal_blocks[blocks] != values;
    for (Py_ssize_t i = 0; !bad && i < values; i++) {
        bad |= z->terminal_values[i] < 0 || z->terminal_values[i] >= values;
    }
    bad |= bad || z->tok_offsets[0] != 0 || z->tok_offsets[nt] != n_ids || z->tok_children[0] < 1;
    for (Py_ssize_t u = 0; !bad && u < nt; u++) {
        int32_t lo = z->tok_children[u], hi = z->tok_children[u + 1];
        bad |= hi < lo || hi > nt || (hi > lo && lo <= u) || z->tok_offsets[u + 1] < z->tok_offsets[u];
    }
    for (Py_ssize_t i = 0; !bad && i < n_ids; i++) {
        bad |= (uint64_t)(uint32_t)z->tok_ids[i] >= limit;
    }
    z->n_eos = eos.shape[0];
    z->eos = (int32_t *)malloc((size_t)(z->n_eos > 0 ? z->n_eos : 1) * sizeof(int32_t));
    if (z->eos != NULL) {
        memcpy(z->eos, eos.buf, (size_t)z->n_eos * sizeof(int32_t));
    }
    PyBuffer_Release(&eos);
    for (Py_ssize_t i = 0; !bad && z->eos != NULL && i < z->n_eos; i++) {
        bad |= (uint64_t)(uint32_t)z->eos[i] >= limit;
    }
    if (bad) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_ValueError, "lazy automaton arrays out of range or inconsistent");
        return NULL;
    }
    z->bucket_bits = 6;
    z->buckets = (Entry **)calloc((size_t)1 << z->bucket_bits, sizeof(Entry *));
    if (z->eos == NULL || z->buckets == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    z->bytes = ((size_t)1 << z->bucket_bits) * sizeof(Entry *);
    z->limit = (size_t)cache_bytes;
    self->num_nodes = num_nodes;
    self->num_states = num_states;
    self->width = width;
    self->dense_min = dense_min;
    return (PyObject *)self;
}

/* edges(node) -> (tokens int32, dests int32) bytearrays of a node's edges, or None to defer */
static PyObject *Kernel_edges(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t node;
    if (nargs != 1 || !exact_int(args[0], &node) || node < 0 || node >= self->num_nodes) {
        Py_RETURN_NONE;
    }
    Edges e;
    if (node_edges(self, node, &e) < 0) {
        return PyErr_NoMemory();
    }
    char *tokens_data, *dests_data;
    PyObject *tokens = new_bytes((Py_ssize_t)e.count * 4, &tokens_data);
    PyObject *dests = tokens ? new_bytes((Py_ssize_t)e.count * 4, &dests_data) : NULL;
    PyObject *result = NULL;
    if (dests != NULL) {
        memcpy(tokens_data, e.tokens, (size_t)e.count * 4);
        memcpy(dests_data, e.dests, (size_t)e.count * 4);
        result = PyTuple_Pack(2, tokens, dests);
    }
    Py_XDECREF(tokens);
    Py_XDECREF(dests);
    return result;
}

/* spell(node) -> the bytes from the root to a lazy trie's node (walking up: a binary search of
 * the first-child samples, then a scan of one block, per byte), or None to defer */
static PyObject *Kernel_spell(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    Lazy *z = self->lazy;
    int64_t node;
    if (z == NULL || nargs != 1 || !exact_int(args[0], &node) || node < 0 || node >= self->num_nodes) {
        Py_RETURN_NONE;
    }
    Py_ssize_t blocks = z->views[2].shape[0], depth = 0;
    uint8_t stack_buffer[256], *spelled = stack_buffer;
    size_t capacity = sizeof(stack_buffer);
    for (int32_t m = (int32_t)node; m != 0;) {
        if ((size_t)depth == capacity) {
            uint8_t *grown = (uint8_t *)PyMem_Malloc(2 * capacity);
            if (grown == NULL) {
                if (spelled != stack_buffer) {
                    PyMem_Free(spelled);
                }
                return PyErr_NoMemory();
            }
            memcpy(grown, spelled, capacity);
            if (spelled != stack_buffer) {
                PyMem_Free(spelled);
            }
            spelled = grown;
            capacity *= 2;
        }
        spelled[depth++] = z->node_byte[m];
        Py_ssize_t lo = 0, hi = blocks; /* the last block whose first child is <= m */
        while (hi - lo > 1) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (z->child_blocks[mid] <= m) {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        int32_t parent = (int32_t)(lo * 64), first = z->child_blocks[lo];
        while (first + (int32_t)(z->node_word[parent] & LAZY_COUNT) <= m) {
            first += z->node_word[parent++] & LAZY_COUNT;
        }
        m = parent;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, depth);
    if (result != NULL) {
        char *out = PyBytes_AS_STRING(result);
        for (Py_ssize_t i = 0; i < depth; i++) {
            out[i] = (char)spelled[depth - 1 - i];
        }
    }
    if (spelled != stack_buffer) {
        PyMem_Free(spelled);
    }
    return result;
}

/* cache_info() -> dict of the lazy cache's counters, or None for an eager kernel */
static PyObject *Kernel_cache_info(Kernel *self, PyObject *unused) {
    Lazy *z = self->lazy;
    if (z == NULL) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("{s:n,s:n,s:n,s:K,s:K,s:K}", "bytes", (Py_ssize_t)z->bytes, "limit", (Py_ssize_t)z->limit,
                         "entries", (Py_ssize_t)z->entries, "hits", z->hits, "misses", z->misses, "evictions",
                         z->evictions);
}

/* patch_info(): an updated set's merged nodes, their edges and whole rows, and the bytes of the
 * kernel's own tables (None for any other kernel) */
static PyObject *Kernel_patch_info(Kernel *self, PyObject *unused) {
    Patch *p = self->patch;
    if (p == NULL) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("{s:L,s:L,s:L,s:L}", "merged_nodes", (long long)p->merged, "merged_edges",
                         (long long)p->merged_edges, "merged_rows", (long long)p->rows, "bytes",
                         (long long)p->owned_bytes);
}

/* cache_clear(): drop every cached row (counters kept) */
static PyObject *Kernel_cache_clear(Kernel *self, PyObject *unused) {
    Lazy *z = self->lazy;
    while (z != NULL && z->oldest != NULL) {
        lazy_evict_oldest(z);
        z->evictions--; /* a clear is not an eviction */
    }
    Py_RETURN_NONE;
}
