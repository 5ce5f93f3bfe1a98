/* ------------------------------------------------------------------ compilation */

typedef struct {
    const int32_t *dense;
    int64_t dense_nodes;
    const uint64_t *table;
    uint64_t mask;
    int shift;
    int32_t sentinel;
} Index;

static inline int32_t index_child(const Index *ix, int32_t u, uint8_t b) {
    if (u < ix->dense_nodes) {
        return ix->dense[(int64_t)u * 256 + b];
    }
    uint64_t key = ((uint64_t)u << 8) | b;
    uint64_t slot = (key * 0x9E3779B97F4A7C15ULL) >> ix->shift;
    for (;;) {
        uint64_t entry = ix->table[slot];
        if (entry == UINT64_MAX) {
            return ix->sentinel;
        }
        if ((entry >> 32) == key) {
            return (int32_t)(entry & 0xFFFFFFFFULL);
        }
        slot = (slot + 1) & ix->mask;
    }
}

/* Tables(dense, dense_nodes, hash_table, hash_shift, first_token, has_children,
 *        dup_offsets|None, dup_tokens|None, child_offsets, node_byte): a token index's
 *        transition tables, checked once (every transition and offset in range) and held for
 *        match_trie and match_dag (which also enumerates a node's children: child_offsets[u]
 *        .. child_offsets[u + 1], each after its parent, node_byte the byte into each). */
typedef struct {
    PyObject_HEAD
    Py_buffer views[8];
    int held; /* a bit per view held (the duplicates' two may be absent) */
    int ready; /* every check passed */
    int have_dups;
    Index ix;
    Py_ssize_t index_nodes;
    const int32_t *child_offsets;
    const uint8_t *node_byte;
} Tables;

static void Tables_dealloc(Tables *self) {
    for (int i = 0; i < 8; i++) {
        if (self->held & (1 << i)) {
            PyBuffer_Release(&self->views[i]);
        }
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Tables_init(Tables *self, PyObject *args, PyObject *kwds) {
    PyObject *objs[8];
    long long dense_nodes;
    int shift;
    if (self->held) {
        PyErr_SetString(PyExc_RuntimeError, "Tables is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OLOiOOOOOO", &objs[0], &dense_nodes, &objs[1], &shift, &objs[2], &objs[3], &objs[4],
                          &objs[5], &objs[6], &objs[7])) {
        return -1;
    }
    static const Py_ssize_t sizes[8] = {4, 8, 4, 1, 8, 4, 4, 1};
    static const char *names[8] = {"dense",      "hash_table", "first_token",   "has_children",
                                   "dup_offsets", "dup_tokens", "child_offsets", "node_byte"};
    self->have_dups = objs[4] != Py_None && objs[5] != Py_None;
    for (int i = 0; i < 8; i++) {
        if ((i == 4 || i == 5) && !self->have_dups) {
            continue;
        }
        if (get_array(objs[i], &self->views[i], sizes[i], names[i]) < 0) {
            return -1;
        }
        self->held |= 1 << i;
    }
    Py_ssize_t index_nodes = self->views[2].shape[0] - 1, table_size = self->views[1].shape[0];
    if (index_nodes < 1 || self->views[3].shape[0] != index_nodes + 1 || dense_nodes < 0 ||
        dense_nodes > index_nodes || dense_nodes * 256 != self->views[0].shape[0] || table_size < 1 ||
        (table_size & (table_size - 1)) != 0 || shift < 1 || shift > 63 || index_nodes >= INT32_MAX ||
        (self->have_dups && self->views[4].shape[0] != index_nodes + 2)) {
        PyErr_SetString(PyExc_ValueError, "Tables: inconsistent arrays");
        return -1;
    }
    const int32_t *dense = (const int32_t *)self->views[0].buf;
    for (Py_ssize_t i = 0; i < self->views[0].shape[0]; i++) {
        if (dense[i] < 0 || dense[i] > index_nodes) {
            PyErr_SetString(PyExc_ValueError, "Tables: transition out of range");
            return -1;
        }
    }
    const uint64_t *slots = (const uint64_t *)self->views[1].buf;
    int empty = 0;
    for (Py_ssize_t i = 0; i < table_size; i++) {
        if (slots[i] == UINT64_MAX) {
            empty = 1;
        } else if ((int64_t)(slots[i] & 0xFFFFFFFFULL) > index_nodes) {
            PyErr_SetString(PyExc_ValueError, "Tables: transition out of range");
            return -1;
        }
    }
    if (!empty) { /* a full table would make a miss probe forever */
        PyErr_SetString(PyExc_ValueError, "Tables: the hash table has no empty slot");
        return -1;
    }
    if (self->have_dups) {
        const int64_t *off = (const int64_t *)self->views[4].buf;
        for (Py_ssize_t i = 0; i < index_nodes + 2; i++) {
            if (off[i] < 0 || off[i] > self->views[5].shape[0] || (i > 0 && off[i] < off[i - 1])) {
                PyErr_SetString(PyExc_ValueError, "Tables: duplicate offsets out of range");
                return -1;
            }
        }
    }
    const int32_t *child_offsets = (const int32_t *)self->views[6].buf;
    if (self->views[6].shape[0] != index_nodes + 2 || self->views[7].shape[0] != index_nodes + 1 ||
        child_offsets[0] != 1 || child_offsets[index_nodes + 1] != index_nodes) {
        PyErr_SetString(PyExc_ValueError, "Tables: child offsets inconsistent with the index");
        return -1;
    }
    for (Py_ssize_t u = 0; u <= index_nodes; u++) {
        int32_t lo = child_offsets[u], hi = child_offsets[u + 1];
        if (hi < lo || hi > index_nodes || (hi > lo && lo <= u)) {
            PyErr_SetString(PyExc_ValueError, "Tables: children must follow their parent, in range");
            return -1;
        }
    }
    self->child_offsets = child_offsets;
    self->node_byte = (const uint8_t *)self->views[7].buf;
    self->ix = (Index){dense, dense_nodes, slots, (uint64_t)table_size - 1, shift, (int32_t)index_nodes};
    self->index_nodes = index_nodes;
    self->ready = 1;
    return 0;
}

static PyTypeObject TablesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask.base._native.Tables",
    .tp_basicsize = sizeof(Tables),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A token index's transition tables, checked once, for match_trie.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tables_init,
    .tp_dealloc = (destructor)Tables_dealloc,
};

/* match_trie(tables, parent, byte, terminal, eos_ids, max_edges)
 *   -> (edge_offsets int32[n + 2], edge_tokens int32, edge_dests int32) as bytearrays, or None
 *      as soon as the edges pass max_edges (>= 0; -1: no limit), before the large allocations
 *
 * The compiler's token matching (see _compile._match) for a trie: for every node m, walk
 * up from m while the path is a suffix of some token, and emit a --token--> m; then the
 * EOS edges of the terminals; then the CSR by source with tokens ascending. */
static PyObject *match_trie(PyObject *module, PyObject *args) {
    PyObject *tables_obj, *objs[4];
    long long max_edges = -1;
    if (!PyArg_ParseTuple(args, "O!OOOO|L", &TablesType, &tables_obj, &objs[0], &objs[1], &objs[2], &objs[3],
                          &max_edges)) {
        return NULL;
    }
    Tables *tables = (Tables *)tables_obj;
    if (!tables->ready) {
        PyErr_SetString(PyExc_ValueError, "match_trie: uninitialised Tables");
        return NULL;
    }
    Py_buffer parent, byte, terminal, eos;
    Py_buffer *views[4] = {&parent, &byte, &terminal, &eos};
    static const Py_ssize_t sizes[4] = {4, 1, 4, 8};
    static const char *names[4] = {"parent", "byte", "terminal", "eos_ids"};
    int held = 0;
    PyObject *result = NULL, *offsets_out = NULL, *tokens_out = NULL, *dests_out = NULL;
    int64_t *counts = NULL;
    uint64_t *edges = NULL;
    for (int i = 0; i < 4; i++) {
        if (get_array(objs[i], views[i], sizes[i], names[i]) < 0) {
            goto done;
        }
        held = i + 1;
    }
    const Index ix = tables->ix;
    Py_ssize_t n = parent.shape[0], k = terminal.shape[0];
    const int32_t *par = (const int32_t *)parent.buf, *term = (const int32_t *)terminal.buf;
    const uint8_t *bytes = (const uint8_t *)byte.buf;
    const int64_t *eos_ids = (const int64_t *)eos.buf;
    const int32_t *first_token = (const int32_t *)tables->views[2].buf;
    const uint8_t *has_children = (const uint8_t *)tables->views[3].buf;
    const int64_t *dup_off = tables->have_dups ? (const int64_t *)tables->views[4].buf : NULL;
    const int32_t *dup_tok = tables->have_dups ? (const int32_t *)tables->views[5].buf : NULL;
    if (n < 1 || byte.shape[0] != n || n + k >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "match_trie: inconsistent arrays");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (par[i] < 0 || par[i] >= n || (i > 0 && par[i] >= i)) {
            PyErr_SetString(PyExc_ValueError, "match_trie: parents must precede their children");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (term[i] < 0 || term[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "match_trie: terminal out of range");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < eos.shape[0]; i++) {
        if (eos_ids[i] < 0 || eos_ids[i] >= INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "match_trie: EOS id out of range");
            goto done;
        }
    }
    counts = (int64_t *)PyMem_Calloc((size_t)n + 2, sizeof(int64_t));
    if (counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* one walk: every (source, token, destination) into a growing buffer, counted by source */
    int64_t total = 0, capacity = 4 * (int64_t)n + (int64_t)k * eos.shape[0] + 16;
    int32_t *found = NULL; /* triples: source, token, destination */
    int failed = 0, over = 0;
    if (max_edges >= 0 && capacity > max_edges + 1) {
        capacity = max_edges + 1; /* the buffer never outgrows the budget */
    }
    Py_BEGIN_ALLOW_THREADS
    found = (int32_t *)malloc((size_t)capacity * 3 * sizeof(int32_t));
    failed = found == NULL;
    for (Py_ssize_t m = 1; !failed && !over && m < n; m++) {
        int32_t a = par[m], u = index_child(&ix, 0, bytes[m]);
        for (;;) {
            if (first_token[u] >= 0) {
                int64_t extra = 1 + (dup_off ? dup_off[u + 1] - dup_off[u] : 0);
                if (max_edges >= 0 && total + extra > max_edges) {
                    over = 1;
                    break;
                }
                if (total + extra > capacity) {
                    capacity = 2 * capacity + extra;
                    if (max_edges >= 0 && capacity > max_edges + 1) {
                        capacity = max_edges + 1; /* still >= total + extra */
                    }
                    int32_t *grown = (int32_t *)realloc(found, (size_t)capacity * 3 * sizeof(int32_t));
                    if (grown == NULL) {
                        failed = 1;
                        break;
                    }
                    found = grown;
                }
                int32_t *t = found + 3 * total;
                t[0] = a, t[1] = first_token[u], t[2] = (int32_t)m;
                total++;
                if (dup_off) {
                    for (int64_t d = dup_off[u]; d < dup_off[u + 1]; d++, total++) {
                        t = found + 3 * total;
                        t[0] = a, t[1] = dup_tok[d], t[2] = (int32_t)m;
                    }
                }
                counts[a] += extra;
            }
            if (!has_children[u] || a == 0) {
                break;
            }
            u = index_child(&ix, u, bytes[a]);
            a = par[a];
        }
    }
    if (!failed && !over) {
        for (Py_ssize_t i = 0; i < k; i++) {
            counts[term[i]] += eos.shape[0];
        }
        total += (int64_t)k * eos.shape[0];
        over = max_edges >= 0 && total > max_edges;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        free(found);
        PyErr_NoMemory();
        goto done;
    }
    if (over) {
        free(found);
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (total >= INT32_MAX) {
        free(found);
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 edges: split the set");
        goto done;
    }
    char *offsets_data = NULL, *tokens_data = NULL, *dests_data = NULL;
    offsets_out = new_bytes((n + 2) * 4, &offsets_data);
    tokens_out = offsets_out ? new_bytes(total * 4, &tokens_data) : NULL;
    dests_out = tokens_out ? new_bytes(total * 4, &dests_data) : NULL;
    edges = dests_out ? (uint64_t *)PyMem_Malloc((size_t)(total > 0 ? total : 1) * sizeof(uint64_t)) : NULL;
    if (edges == NULL) {
        free(found);
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    int32_t *offsets = (int32_t *)offsets_data;
    int32_t *tokens = (int32_t *)tokens_data, *dests = (int32_t *)dests_data;
    Py_BEGIN_ALLOW_THREADS
    /* offsets, then a counting sort of the triples by source (counts becomes the cursor),
       each edge as one key (token << 32 | destination) so that its order is the token's */
    offsets[0] = 0;
    for (Py_ssize_t i = 0; i <= n; i++) {
        offsets[i + 1] = offsets[i] + (int32_t)(i < n ? counts[i] : 0);
        if (i < n) {
            counts[i] = offsets[i];
        }
    }
    int64_t text = total - (int64_t)k * eos.shape[0];
    for (int64_t i = 0; i < text; i++) {
        const int32_t *t = found + 3 * i;
        edges[counts[t[0]]++] = (uint64_t)(uint32_t)t[1] << 32 | (uint32_t)t[2];
    }
    free(found);
    for (Py_ssize_t i = 0; i < k; i++) {
        for (Py_ssize_t e = 0; e < eos.shape[0]; e++) {
            edges[counts[term[i]]++] = (uint64_t)eos_ids[e] << 32 | (uint32_t)(n + i);
        }
    }
    for (Py_ssize_t node = 0; node < n; node++) {
        sort_keys(edges + offsets[node], offsets[node + 1] - offsets[node]);
    }
    for (int64_t i = 0; i < total; i++) {
        tokens[i] = (int32_t)(edges[i] >> 32);
        dests[i] = (int32_t)(edges[i] & 0xFFFFFFFFu);
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(3, offsets_out, tokens_out, dests_out);
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(views[i]);
    }
    PyMem_Free(counts);
    PyMem_Free(edges);
    Py_XDECREF(offsets_out);
    Py_XDECREF(tokens_out);
    Py_XDECREF(dests_out);
    return result;
}

