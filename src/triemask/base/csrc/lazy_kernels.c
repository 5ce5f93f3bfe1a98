/* ------------------------------------------------------------------ lazy kernels */

static void TokenTrieTables_dealloc(TokenTrieTables *self) {
    for (int i = 0; i < self->held; i++) {
        PyBuffer_Release(&self->views[i]);
    }
    PyMem_Free(self->pre);
    PyMem_Free(self->byte_depth);
    PyMem_Free(self->skip);
    PyMem_Free(self->offsets);
    PyMem_Free(self->ids);
    PyMem_Free(self->parent);
    PyMem_Free(self->token_node);
    PyMem_Free(self->below);
    PyMem_Free(self->height);
    free(self->keys);
    free(self->stack);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The preorder copy of checked breadth-first arrays (children after their parent): subtree
 * sizes bottom-up, then each node's children placed after it in one forward pass. */
static int token_trie_preorder(TokenTrieTables *self, const int32_t *children, const uint8_t *bytes,
                               const int32_t *offsets, const int32_t *ids, int32_t nt, Py_ssize_t id_count) {
    int32_t *size = (int32_t *)PyMem_Malloc((size_t)nt * sizeof(int32_t));
    int32_t *at = self->pre = (int32_t *)PyMem_Malloc((size_t)nt * sizeof(int32_t));
    int32_t *level = (int32_t *)PyMem_Malloc((size_t)nt * sizeof(int32_t));
    self->byte_depth = (uint32_t *)PyMem_Malloc((size_t)nt * sizeof(uint32_t));
    self->skip = (int32_t *)PyMem_Malloc((size_t)nt * sizeof(int32_t));
    self->offsets = (int32_t *)PyMem_Malloc(((size_t)nt + 1) * sizeof(int32_t));
    self->ids = (int32_t *)PyMem_Malloc(((size_t)offsets[nt] + 1) * sizeof(int32_t));
    self->parent = (int32_t *)PyMem_Malloc((size_t)nt * sizeof(int32_t));
    self->token_node = (int32_t *)PyMem_Malloc((size_t)id_count * sizeof(int32_t));
    self->below = (uint64_t *)PyMem_Calloc((size_t)nt, sizeof(uint64_t));
    self->height = (uint8_t *)PyMem_Calloc((size_t)nt, 1);
    if (!size || !at || !level || !self->byte_depth || !self->skip || !self->offsets || !self->ids ||
        !self->parent || !self->token_node || !self->below || !self->height) {
        PyMem_Free(size);
        PyMem_Free(level);
        PyErr_NoMemory();
        return -1;
    }
    for (int32_t u = nt - 1; u >= 0; u--) {
        size[u] = 1;
        for (int32_t j = children[u]; j < children[u + 1]; j++) {
            size[u] += size[j];
        }
    }
    at[0] = 0;
    level[0] = 0;
    self->byte_depth[0] = 0;
    self->parent[0] = 0;
    int32_t depth = 0;
    for (int32_t u = 0; u < nt; u++) {
        int32_t k = at[u] + 1;
        self->skip[at[u]] = at[u] + size[u];
        for (int32_t j = children[u]; j < children[u + 1]; j++) {
            at[j] = k;
            level[j] = level[u] + 1;
            depth = level[j] > depth ? level[j] : depth;
            if (depth >= (1 << 24)) { /* (a token of 16 MiB) */
                PyMem_Free(size);
                PyMem_Free(level);
                PyErr_SetString(PyExc_ValueError, "token trie arrays out of range or inconsistent");
                return -1;
            }
            self->byte_depth[k] = (uint32_t)level[j] << 8 | bytes[j];
            self->parent[k] = at[u];
            k += size[j];
        }
    }
    self->offsets[0] = 0;
    for (int32_t u = 0; u < nt; u++) { /* counts by preorder node, then their running sum */
        self->offsets[at[u] + 1] = offsets[u + 1] - offsets[u];
    }
    for (int32_t k = 0; k < nt; k++) {
        self->offsets[k + 1] += self->offsets[k];
    }
    self->ids[offsets[nt]] = 0; /* one spare: a walk reads a node's first id whether it has one or not */
    memset(self->token_node, 0xFF, (size_t)id_count * sizeof(int32_t));
    for (int32_t u = 0; u < nt; u++) {
        if (offsets[u + 1] > offsets[u]) {
            memcpy(self->ids + self->offsets[at[u]], ids + offsets[u], (size_t)(offsets[u + 1] - offsets[u]) * 4);
        }
        for (int32_t i = offsets[u]; i < offsets[u + 1]; i++) { /* (ids checked inside the row) */
            self->token_node[ids[i]] = at[u];
        }
    }
    for (int32_t u = nt - 1; u >= 0; u--) { /* children after their parent: the summaries bottom-up */
        for (int32_t j = children[u]; j < children[u + 1]; j++) {
            int height = self->height[j] < 255 ? self->height[j] + 1 : 255;
            self->below[u] |= self->below[j] | (uint64_t)1 << BYTE_GROUP[bytes[j]];
            self->height[u] = (uint8_t)(height > self->height[u] ? height : self->height[u]);
        }
    }
    PyMem_Free(size);
    PyMem_Free(level);
    self->nodes = nt;
    return 0;
}

static int TokenTrieTables_init(TokenTrieTables *self, PyObject *args, PyObject *kwds) {
    PyObject *objs[4];
    Py_buffer *views = self->views;
    Py_ssize_t width;
    if (self->held || self->byte_depth != NULL) {
        PyErr_SetString(PyExc_ValueError, "TokenTrieTables: already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOn", &objs[0], &objs[1], &objs[2], &objs[3], &width)) {
        return -1;
    }
    static const Py_ssize_t sizes[4] = {4, 1, 4, 4};
    static const char *names[4] = {"children", "node_byte", "token_offsets", "token_ids"};
    for (; self->held < 4; self->held++) { /* (released by the dealloc) */
        if (get_array(objs[self->held], &views[self->held], sizes[self->held], names[self->held]) < 0) {
            return -1;
        }
    }
    const int32_t *children = (const int32_t *)views[0].buf, *offsets = (const int32_t *)views[2].buf;
    const int32_t *ids = (const int32_t *)views[3].buf;
    Py_ssize_t nt = views[1].shape[0], n_ids = views[3].shape[0];
    uint64_t limit = 32 * (uint64_t)width; /* a token's bit lies in the row */
    int bad = width < 1 || width > ((int64_t)1 << 26) || nt < 1 || nt >= INT32_MAX || views[0].shape[0] != nt + 1 ||
              views[2].shape[0] != nt + 1;
    bad |= bad || offsets[0] != 0 || offsets[nt] != n_ids || children[0] != 1 || children[nt] != nt; /* a tree */
    for (Py_ssize_t u = 0; !bad && u < nt; u++) {
        int32_t lo = children[u], hi = children[u + 1];
        bad |= hi < lo || hi > nt || (hi > lo && lo <= u) || offsets[u + 1] < offsets[u];
    }
    for (Py_ssize_t i = 0; !bad && i < n_ids; i++) {
        bad |= (uint64_t)(uint32_t)ids[i] >= limit;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "token trie arrays out of range or inconsistent");
        return -1;
    }
    if (token_trie_preorder(self, children, (const uint8_t *)views[1].buf, offsets, ids, (int32_t)nt, 32 * width) < 0) {
        return -1;
    }
    self->children = children, self->node_byte = (const uint8_t *)views[1].buf;
    self->token_offsets = offsets, self->token_ids = ids;
    self->width = width;
    self->ready = 1;
    return 0;
}

static PyTypeObject TokenTrieTablesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask.base._native.TokenTrieTables",
    .tp_basicsize = sizeof(TokenTrieTables),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A vocabulary's forward token trie, checked once, for the lazy kernels.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)TokenTrieTables_init,
    .tp_dealloc = (destructor)TokenTrieTables_dealloc,
};

/* A small DAG's runs (Lazy.run_mask, run_node): for each node c, the byte groups all of whose
 * bytes lead to one node, the one most groups lead to (c's run step; none when no group is
 * whole), and down the steps, the groups whole at every one of the first m (deeper nodes first:
 * a step leads down a level). 0, or -1 for no memory. */
static int dag_runs(Lazy *z, Py_ssize_t n) {
    z->run_mask = (uint64_t *)PyMem_Malloc((size_t)n * (RUN_MAX + 1) * sizeof(uint64_t));
    z->run_node = (uint8_t *)PyMem_Malloc((size_t)n * (RUN_MAX + 1));
    z->run_to = (int16_t *)PyMem_Malloc((size_t)n * (RUN_MAX + 1) * sizeof(int16_t));
    z->run_step = (uint64_t *)PyMem_Malloc((size_t)n * sizeof(uint64_t));
    z->run_closed = (uint8_t *)PyMem_Malloc((size_t)n);
    int32_t *first = (int32_t *)PyMem_Malloc(((size_t)n + 1) * sizeof(int32_t));
    if (z->run_mask == NULL || z->run_node == NULL || z->run_to == NULL || z->run_step == NULL ||
        z->run_closed == NULL || first == NULL) {
        PyMem_Free(first);
        return -1;
    }
    first[0] = 1;
    for (Py_ssize_t c = 0; c < n; c++) {
        first[c + 1] = first[c] + (z->node_word[c] & LAZY_COUNT);
    }
    for (Py_ssize_t c = n - 1; c >= 0; c--) {
        uint8_t to[64];
        int count[64] = {0}, mixed[64] = {0}, covered[DAG_NONE] = {0}, best = DAG_NONE;
        for (int32_t at = first[c]; at < first[c + 1]; at++) { /* whole: all its bytes lead to one node */
            int g = BYTE_GROUP[z->node_byte[at]];
            mixed[g] |= count[g]++ > 0 && to[g] != z->slot_dest[at];
            to[g] = (uint8_t)z->slot_dest[at];
        }
        uint64_t whole = 0;
        for (int g = 0; g < 64; g++) {
            if (count[g] == BYTE_GROUP_SIZE[g] && count[g] > 0 && !mixed[g]) {
                whole |= (uint64_t)1 << g;
                covered[to[g]] += count[g];
                best = best == DAG_NONE || covered[to[g]] > covered[best] ? to[g] : best;
            }
        }
        uint64_t mask = 0;
        int bytes = 0;
        for (int g = 0; g < 64; g++) {
            mask |= whole >> g & 1 && to[g] == best ? (uint64_t)1 << g : 0;
            bytes += whole >> g & 1 && to[g] == best ? BYTE_GROUP_SIZE[g] : 0;
        }
        /* closed: every byte out of c is in its run's groups, so that a byte outside them ends a
         * match; held as how many steps on from c that stays so, and RUN_WIDE where the run takes
         * WIDE_RUN_BYTES bytes or more (see lazy_scan_run) */
        int on = best == DAG_NONE ? RUN_MAX : 1 + (z->run_closed[best] & ~RUN_WIDE);
        int closed = bytes == first[c + 1] - first[c] ? (on < RUN_MAX ? on : RUN_MAX) : 0;
        z->run_step[c] = mask;
        z->run_closed[c] = (uint8_t)(closed | (bytes >= WIDE_RUN_BYTES ? RUN_WIDE : 0));
        uint64_t *runs = z->run_mask + c * (RUN_MAX + 1);
        uint8_t *nodes = z->run_node + c * (RUN_MAX + 1);
        runs[0] = ~(uint64_t)0, nodes[0] = (uint8_t)c;
        for (int m = 1; m <= RUN_MAX; m++) { /* best > c: its runs are made */
            runs[m] = best == DAG_NONE ? 0 : mask & z->run_mask[best * (RUN_MAX + 1) + m - 1];
            nodes[m] = best == DAG_NONE ? DAG_NONE : z->run_node[best * (RUN_MAX + 1) + m - 1];
        }
    }
    for (Py_ssize_t at = 0; at < n * (RUN_MAX + 1); at++) {
        uint8_t node = z->run_node[at];
        z->run_to[at] = (int16_t)(node == DAG_NONE || z->node_word[node] & LAZY_DEAD ? -1 : node);
    }
    PyMem_Free(first);
    return 0;
}

/* lazy_kernel(node_byte u8, node_word u16, child_blocks i32, terminal_blocks i32,
 *             terminal_values i32, token_trie TokenTrieTables, eos_ids i32, num_nodes,
 *             num_states, width, dense_min, cache_bytes, slot_dest) -> Kernel
 * slot_dest: None for a trie, else a DAG's i32 destination by slot (see Lazy). Every array is
 * checked here (counts against the samples, a trie's children after their parent, a DAG's
 * slots in range, ids in range; the token trie when its TokenTrieTables was made), so that no
 * lookup can leave them whatever they hold. */
static PyObject *lazy_kernel(PyObject *module, PyObject *args) {
    PyObject *objs[7], *token_trie;
    long long num_nodes, num_states, dense_min, cache_bytes;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OOOOOO!OLLnLLO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4],
                          &TokenTrieTablesType, &token_trie, &objs[5], &num_nodes, &num_states, &width, &dense_min,
                          &cache_bytes, &objs[6])) {
        return NULL;
    }
    const TokenTrieTables *tt = (const TokenTrieTables *)token_trie;
    if (!tt->ready || tt->width != width) {
        PyErr_SetString(PyExc_ValueError, "lazy_kernel: a token trie checked for another row width, or none");
        return NULL;
    }
    static const Py_ssize_t sizes[6] = {1, 2, 4, 4, 4, 4};
    static const char *names[6] = {"node_byte", "node_word", "child_blocks", "terminal_blocks", "terminal_values",
                                   "eos_ids"};
    int dag = objs[6] != Py_None;
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
    Py_INCREF(token_trie);
    z->token_trie = token_trie;
    Py_buffer eos;
    for (int i = 0; i < 6; i++) {
        if (get_array(objs[i], i < 5 ? &z->views[i] : &eos, sizes[i], names[i]) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        if (i < 5) {
            z->held = i + 1;
        }
    }
    z->node_byte = (const uint8_t *)z->views[0].buf;
    z->node_word = (const uint16_t *)z->views[1].buf;
    z->child_blocks = (const int32_t *)z->views[2].buf;
    z->terminal_blocks = (const int32_t *)z->views[3].buf;
    z->terminal_values = (const int32_t *)z->views[4].buf;
    z->tok = (TokenTrieTables *)token_trie;
    if (dag) {
        if (get_array(objs[6], &z->views[5], 4, "slot_dest") < 0) {
            PyBuffer_Release(&eos);
            Py_DECREF(self);
            return NULL;
        }
        z->held = 6;
        z->slot_dest = (const int32_t *)z->views[5].buf;
    }
    /* n nodes; slots: a trie's are its nodes, a DAG's as many as node_byte holds */
    Py_ssize_t n = z->views[1].shape[0], slots = z->views[0].shape[0], blocks = (n + 63) / 64;
    Py_ssize_t values = z->views[4].shape[0];
    uint64_t limit = 32 * (uint64_t)width; /* a token's bit lies in the row */
    int bad = n < 1 || n != num_nodes || dense_min < 1 || cache_bytes < 0 || num_states != num_nodes + values ||
              n >= INT32_MAX - values ||
              (dag ? slots < 1 || z->views[5].shape[0] != slots || slots >= INT32_MAX : slots != n) ||
              z->views[2].shape[0] != blocks + 1 || z->views[3].shape[0] != blocks + 1;
    int64_t first = 1, terminals = 0;
    for (Py_ssize_t a = 0; !bad && a < n; a++) {
        if (a % 64 == 0) {
            bad |= z->child_blocks[a / 64] != first || z->terminal_blocks[a / 64] != terminals;
        }
        int64_t count = z->node_word[a] & LAZY_COUNT;
        bad |= count > 256 || (count > 0 && ((!dag && first <= a) || first + count > slots));
        first += count;
        terminals += (z->node_word[a] & LAZY_TERMINAL) != 0;
    }
    bad |= bad || first != slots || z->child_blocks[blocks] != slots || terminals != values ||
           z->terminal_blocks[blocks] != values;
    for (Py_ssize_t slot = 1; !bad && dag && slot < slots; slot++) {
        bad |= z->slot_dest[slot] < 1 || z->slot_dest[slot] >= n;
    }
    if (!bad && dag) { /* each node's out-bytes as bits, their slots by rank (see Lazy) */
        z->dag_bits = (uint64_t *)PyMem_Calloc((size_t)n * 4, sizeof(uint64_t));
        z->dag_rank = (int32_t *)PyMem_Malloc((size_t)n * 4 * sizeof(int32_t));
        if (z->dag_bits == NULL || z->dag_rank == NULL) {
            PyBuffer_Release(&eos);
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
        int32_t slot = 1;
        for (Py_ssize_t a = 0; !bad && a < n; a++) {
            int32_t count = z->node_word[a] & LAZY_COUNT, end = slot + count;
            for (int32_t at = slot; !bad && at < end; at++) { /* ascending bytes, once each */
                uint8_t byte = z->node_byte[at];
                bad |= at > slot && byte <= z->node_byte[at - 1];
                z->dag_bits[4 * a + byte / 64] |= (uint64_t)1 << (byte % 64);
            }
            for (int q = 0; q < 4; q++) {
                z->dag_rank[4 * a + q] = slot;
                slot += popcount64(z->dag_bits[4 * a + q]);
            }
        }
        if (!bad && n < DAG_NONE) { /* a small DAG's destinations in one table besides */
            z->dag_small = (uint8_t *)PyMem_Malloc((size_t)n * 256);
            if (z->dag_small == NULL) {
                PyBuffer_Release(&eos);
                Py_DECREF(self);
                return PyErr_NoMemory();
            }
            memset(z->dag_small, DAG_NONE, (size_t)n * 256);
            for (Py_ssize_t a = 0, at = 1; a < n; a++) {
                for (int32_t end = (int32_t)at + (z->node_word[a] & LAZY_COUNT); at < end; at++) {
                    z->dag_small[256 * a + z->node_byte[at]] = (uint8_t)z->slot_dest[at];
                }
            }
            if (dag_runs(z, n) < 0) {
                PyBuffer_Release(&eos);
                Py_DECREF(self);
                return PyErr_NoMemory();
            }
        }
    }
    for (Py_ssize_t i = 0; !bad && i < values; i++) {
        bad |= z->terminal_values[i] < 0 || z->terminal_values[i] >= values;
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
    if (node_edges(self, node, &e) < 0 || listed_edges(self, node, &e) < 0) {
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
    if (z == NULL || z->slot_dest != NULL || nargs != 1 || !exact_int(args[0], &node) || node < 0 ||
        node >= self->num_nodes) {
        Py_RETURN_NONE; /* (a DAG's node does not determine its text) */
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

/* patch_info(): an updated set's cut nodes and tokens, and the bytes of the kernel's own
 * table (the bit per base node); None for any other kernel */
static PyObject *Kernel_patch_info(Kernel *self, PyObject *unused) {
    Patch *p = self->patch;
    if (p == NULL) {
        Py_RETURN_NONE;
    }
    long long bits = 8 * (((const Kernel *)p->base)->num_nodes / 64 + 1);
    return Py_BuildValue("{s:n,s:n,s:L}", "cut_nodes", p->nodes.shape[0], "cut_tokens", p->tokens.shape[0], "bytes",
                         bits);
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

/* lazy_dag_layout(source i32[E], byte u8[E], dest i32[E], accepting i32[K], num_nodes) ->
 * (node_byte u8[E + 1], slot_dest i32[E + 1], node_word u16[n], child_blocks i32, terminal_blocks
 * i32) as bytearrays: a ByteDag's lazy layout (sets.lazy.lazy_dag_arrays, which stays the
 * reference), its edges by source then byte as slots from 1, each node's word (its edge count,
 * accepting or not) and the samples every 64th node. Ten NumPy calls took 45 us, a fifth of a
 * pattern's lazy compile. ValueError for ids out of range or a node with more than 256 edges. */
static PyObject *lazy_dag_layout(PyObject *module, PyObject *args) {
    PyObject *objs[4];
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOOOn", &objs[0], &objs[1], &objs[2], &objs[3], &n)) {
        return NULL;
    }
    static const Py_ssize_t sizes[4] = {4, 1, 4, 4};
    static const char *names[4] = {"source", "byte", "dest", "accepting"};
    Py_buffer views[4];
    int held = 0;
    PyObject *out[5] = {NULL}, *result = NULL;
    int64_t *place = NULL;
    for (; held < 4; held++) {
        if (get_array(objs[held], &views[held], sizes[held], names[held]) < 0) {
            goto done;
        }
    }
    const int32_t *source = (const int32_t *)views[0].buf, *dest = (const int32_t *)views[2].buf;
    const int32_t *accepting = (const int32_t *)views[3].buf;
    const uint8_t *byte = (const uint8_t *)views[1].buf;
    Py_ssize_t edges = views[0].shape[0], k = views[3].shape[0], blocks = (n + 63) / 64;
    int bad = n < 1 || n >= INT32_MAX || edges >= INT32_MAX || views[1].shape[0] != edges || views[2].shape[0] != edges;
    for (Py_ssize_t i = 0; !bad && i < edges; i++) {
        bad |= source[i] < 0 || source[i] >= n || dest[i] < 0 || dest[i] >= n;
    }
    for (Py_ssize_t i = 0; !bad && i < k; i++) {
        bad |= accepting[i] < 0 || accepting[i] >= n;
    }
    char *data[5];
    Py_ssize_t bytes[5] = {edges + 1, 4 * (edges + 1), 2 * n, 4 * (blocks + 1), 4 * (blocks + 1)};
    for (int i = 0; !bad && i < 5; i++) {
        if ((out[i] = new_bytes(bytes[i], &data[i])) == NULL) {
            goto done;
        }
    }
    place = bad ? NULL : (int64_t *)calloc((size_t)n + 1, sizeof(int64_t));
    if (bad || place == NULL) {
        if (!bad) {
            PyErr_NoMemory();
        } else {
            PyErr_SetString(PyExc_ValueError, "lazy_dag_layout: a DAG's arrays out of range or inconsistent");
        }
        goto done;
    }
    uint8_t *node_byte = (uint8_t *)data[0];
    int32_t *slot_dest = (int32_t *)data[1], *child_blocks = (int32_t *)data[3], *terminal_blocks = (int32_t *)data[4];
    uint16_t *word = (uint16_t *)data[2];
    memset(word, 0, (size_t)n * 2);
    for (Py_ssize_t i = 0; i < edges; i++) { /* counts, then each node's first slot */
        place[source[i] + 1]++;
    }
    for (Py_ssize_t v = 0; v < n; v++) {
        if (place[v + 1] > 256) {
            PyErr_SetString(PyExc_ValueError, "lazy_dag_layout: a node with more than 256 edges");
            goto done;
        }
        word[v] = (uint16_t)place[v + 1];
        place[v + 1] += place[v];
    }
    node_byte[0] = 0, slot_dest[0] = 0;
    for (Py_ssize_t i = 0; i < edges; i++) { /* by source (a counting sort) */
        int64_t at = 1 + place[source[i]]++;
        node_byte[at] = byte[i], slot_dest[at] = dest[i];
    }
    int64_t first = 1; /* then each node's slots by byte, in place (a few each: insertion) */
    for (Py_ssize_t v = 0; v < n; v++) {
        int64_t end = first + word[v];
        for (int64_t i = first + 1; i < end; i++) {
            uint8_t b = node_byte[i];
            int32_t d = slot_dest[i];
            int64_t j = i;
            for (; j > first && node_byte[j - 1] > b; j--) {
                node_byte[j] = node_byte[j - 1], slot_dest[j] = slot_dest[j - 1];
            }
            node_byte[j] = b, slot_dest[j] = d;
        }
        first = end;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        word[accepting[i]] |= LAZY_TERMINAL;
    }
    int32_t slots = 1, terminals = 0;
    for (Py_ssize_t v = 0; v < n; v++) {
        if (v % 64 == 0) {
            child_blocks[v / 64] = slots, terminal_blocks[v / 64] = terminals;
        }
        slots += word[v] & LAZY_COUNT;
        terminals += (word[v] & LAZY_TERMINAL) != 0;
    }
    child_blocks[blocks] = slots, terminal_blocks[blocks] = terminals;
    result = PyTuple_Pack(5, out[0], out[1], out[2], out[3], out[4]);
done:
    free(place);
    for (int i = 0; i < 5; i++) {
        Py_XDECREF(out[i]);
    }
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
    }
    return result;
}
