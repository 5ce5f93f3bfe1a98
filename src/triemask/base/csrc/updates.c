/* ------------------------------------------------------------------ incremental updates */

/* What with_values (triemask.sets.update) asks of the kernels: the values' walks down the base's
 * trie (walk_paths), the cut pass over the removed ones' nodes (tombstone_edges), and each delta
 * node's partner in the base (partner_nodes). The NumPy code in sets/update.py is the reference;
 * these take the same inputs and give the same outputs. */

/* Where the values end: by the EOS edge of a node (`eos` >= 0: to the final state num_nodes +
 * the value's index), else in the ascending terminal nodes and their values' indices. */
typedef struct {
    int64_t eos;
    const int32_t *nodes, *values;
    Py_ssize_t count;
} ValueEnds;

/* The index of the value ending at node `node`, or -1. */
static int64_t value_at(const Kernel *k, const ValueEnds *ends, int64_t node) {
    if (ends->eos >= 0) {
        Edges e;
        node_edges(k, node, &e); /* (eager: cannot fail) */
        /* EOS ids come last in most vocabularies: the last edge first, one cache line */
        int32_t last = e.count > 0 ? e.tokens[e.count - 1] : -1;
        int32_t final = last < ends->eos ? -1 : last == ends->eos ? e.dests[e.count - 1] : edge_to(&e, ends->eos);
        return final >= k->num_nodes ? final - k->num_nodes : -1;
    }
    Py_ssize_t at = find_int32(ends->nodes, ends->count, node);
    return at >= 0 ? ends->values[at] : -1;
}

/* The node after a single-byte token from node `state` (-1: none), found by galloping from the
 * first edge: byte tokens have the lowest ids in the vocabularies met (0-255 in byte-level BPE,
 * 3-258 with SentencePiece's byte fallback), so it reads the first cache line of a node's edges
 * where a binary search would start in the middle of a long list (the walks read the base out
 * of the caches: an update's first call). */
static int32_t walk_next(const Kernel *k, int64_t state, int64_t token) {
    if (state < 0 || state >= k->num_nodes) {
        return -1;
    }
    Edges e;
    node_edges(k, state, &e); /* (eager: cannot fail) */
    Py_ssize_t lo = 0, step = 1;
    while (lo + step < e.count && e.tokens[lo + step] < token) {
        lo += step;
        step *= 2;
    }
    Py_ssize_t span = lo + step < e.count ? step + 1 : e.count - lo;
    Py_ssize_t at = find_int32(e.tokens + lo, span, token);
    return at >= 0 ? e.dests[lo + at] : -1;
}

/* walk_paths(kernel, values, byte_tokens, initial, by_eos, terminal_nodes, terminal_values)
 *   -> (paths, lengths, ends) as int64 bytes
 * values: a list of bytes; byte_tokens: int64 [256], the single-byte token of each byte (-1:
 * none); where the values end as in tombstone_edges. paths (values x (longest + 1)): paths[i, d]
 * the node after the first d bytes of value i, DEAD (-1) from where it leaves the trie or past
 * its length; lengths[i] its length; ends[i] the index of the base value it is (-1: none). */
static PyObject *walk_paths(PyObject *module, PyObject *args) {
    PyObject *kernel_obj, *values, *objs[3];
    long long initial, by_eos;
    if (!PyArg_ParseTuple(args, "O!O!OLLOO", &KernelType, &kernel_obj, &PyList_Type, &values, &objs[0], &initial,
                          &by_eos, &objs[1], &objs[2])) {
        return NULL;
    }
    const Kernel *k = (const Kernel *)kernel_obj;
    Py_buffer views[3];
    static const Py_ssize_t sizes[3] = {8, 4, 4};
    static const char *names[3] = {"byte_tokens", "terminal_nodes", "terminal_values"};
    int held = 0;
    PyObject *result = NULL;
    for (; held < 3; held++) {
        if (get_array(objs[held], &views[held], sizes[held], names[held]) < 0) {
            goto done;
        }
    }
    const int64_t *byte_tokens = (const int64_t *)views[0].buf;
    const ValueEnds ends = {by_eos, (const int32_t *)views[1].buf, (const int32_t *)views[2].buf, views[1].shape[0]};
    Py_ssize_t count = PyList_GET_SIZE(values), longest = 0;
    int ok = k->lazy == NULL && k->patch == NULL && views[0].shape[0] == 256 &&
             views[1].shape[0] == views[2].shape[0] && initial >= 0 && initial < k->num_nodes &&
             by_eos < 32 * (long long)k->width;
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        ok = PyBytes_Check(value);
        longest = ok && PyBytes_GET_SIZE(value) > longest ? PyBytes_GET_SIZE(value) : longest;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "walk_paths: an eager kernel, a list of bytes, 256 byte tokens");
        goto done;
    }
    char *data[3];
    PyObject *out[3] = {new_bytes(count * (longest + 1) * 8, &data[0]), new_bytes(count * 8, &data[1]),
                        new_bytes(count * 8, &data[2])};
    if (out[0] != NULL && out[1] != NULL && out[2] != NULL) {
        int64_t *paths = (int64_t *)data[0], *lengths = (int64_t *)data[1], *found = (int64_t *)data[2];
        for (Py_ssize_t i = 0; i < count; i++) {
            lengths[i] = PyBytes_GET_SIZE(PyList_GET_ITEM(values, i));
            paths[i * (longest + 1)] = initial;
        }
        /* depth by depth across the values, not value by value: a step's lookups wait on the
         * memory of the node the previous step found, while the values' steps at one depth
         * are independent, so their cache misses overlap (2x on an automaton out of the caches) */
        for (Py_ssize_t d = 0; d < longest; d++) {
            for (Py_ssize_t i = 0; i < count; i++) {
                int64_t *row = paths + i * (longest + 1), state = row[d];
                const uint8_t *bytes = (const uint8_t *)PyBytes_AS_STRING(PyList_GET_ITEM(values, i));
                row[d + 1] = d < lengths[i] ? walk_next(k, state, byte_tokens[bytes[d]]) : -1;
            }
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            int64_t end = paths[i * (longest + 1) + lengths[i]];
            found[i] = end >= 0 && end < k->num_nodes ? value_at(k, &ends, end) : -1;
        }
        result = PyTuple_Pack(3, out[0], out[1], out[2]);
    }
    Py_XDECREF(out[0]), Py_XDECREF(out[1]), Py_XDECREF(out[2]);
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
    }
    return result;
}

/* A node met on the removed values' walks: its id, its parent's (-1 for the root) and its depth. */
typedef struct {
    int64_t node, parent, depth;
} PathNode;

/* What the cut pass knows of a node on the walks. */
enum { DEAD_NODE = 1, OWN = 2, ABOVE_DEAD = 4 }; /* OWN: a removed value ends there */
enum { SCAN_AHEAD = 4 };

/* The cut pass once the walks' nodes are known (n of them, ascending by node, `up[i]` the
 * index of node i's parent or -1, `flags[i]` OWN where a removed value ends there): the cut
 * nodes, their offsets and tokens appended to `cut`, `offsets`, `tokens`. 0, or -1 out of
 * memory. */
static int cut_edges(const Kernel *k, const ValueEnds *ends, const PathNode *at, const Py_ssize_t *up, uint8_t *flags,
                     Py_ssize_t n, const Py_buffer *single, const int64_t *eos, Py_ssize_t n_eos, int64_t initial,
                     Int32s *cut, Int32s *offsets, Int32s *tokens) {
    /* per node: its children (single-byte edges), children on the paths, dead children */
    int64_t *counts = (int64_t *)calloc((size_t)(3 * n + 1), sizeof(int64_t));
    Py_ssize_t *order = (Py_ssize_t *)malloc((size_t)(n + 1) * sizeof(Py_ssize_t));
    uint64_t *dead_bits = (uint64_t *)calloc((size_t)(k->num_nodes / 64 + 1), 8);
    int failed = counts == NULL || order == NULL || dead_bits == NULL;
    int64_t *children = counts, *on_paths = counts + n, *dead_children = counts + 2 * n;
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        if (up[i] >= 0) {
            on_paths[up[i]]++;
        }
    }
    /* the nodes that may die (no value kept, every child on a path), deepest first; a node's
       children are counted only as far as telling whether they all lie on paths */
    Py_ssize_t maybe = 0;
    int64_t deepest = 0;
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        if (at[i].node == initial) {
            continue;
        }
        Edges e;
        node_edges(k, at[i].node, &e); /* (eager: cannot fail) */
        const uint8_t *is_single = (const uint8_t *)single->buf;
        /* (the edges ascend by token: past the last single-byte id there are no more children) */
        for (int32_t j = 0; j < e.count && e.tokens[j] < single->shape[0] && children[i] <= on_paths[i]; j++) {
            children[i] += is_single[e.tokens[j]] != 0;
        }
        /* (whether it keeps a value is asked last: it reads the far end of the node's edges) */
        if (children[i] <= on_paths[i] && ((flags[i] & OWN) || value_at(k, ends, at[i].node) < 0)) {
            order[maybe++] = i;
            deepest = at[i].depth > deepest ? at[i].depth : deepest;
        }
    }
    if (!failed && maybe > 1) { /* by depth, deepest first, stable: a counting sort (depths are short) */
        Py_ssize_t *starts = (Py_ssize_t *)calloc((size_t)deepest + 2, sizeof(Py_ssize_t));
        Py_ssize_t *sorted = (Py_ssize_t *)malloc((size_t)maybe * sizeof(Py_ssize_t));
        failed = starts == NULL || sorted == NULL;
        for (Py_ssize_t m = 0; !failed && m < maybe; m++) {
            starts[deepest - at[order[m]].depth + 1]++;
        }
        for (int64_t d = 1; !failed && d <= deepest + 1; d++) {
            starts[d] += starts[d - 1];
        }
        for (Py_ssize_t m = 0; !failed && m < maybe; m++) {
            sorted[starts[deepest - at[order[m]].depth]++] = order[m];
        }
        if (!failed) {
            memcpy(order, sorted, (size_t)maybe * sizeof(Py_ssize_t));
        }
        free(starts), free(sorted);
    }
    for (Py_ssize_t m = 0; !failed && m < maybe; m++) {
        Py_ssize_t i = order[m];
        if (dead_children[i] == children[i]) {
            flags[i] |= DEAD_NODE;
            dead_bits[at[i].node >> 6] |= (uint64_t)1 << (at[i].node & 63);
            if (up[i] >= 0) {
                dead_children[up[i]]++;
            }
        }
    }
    /* only an ancestor of a dead node can have an edge into one */
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        for (Py_ssize_t a = (flags[i] & DEAD_NODE) ? up[i] : -1; a >= 0 && !(flags[a] & ABOVE_DEAD); a = up[a]) {
            flags[a] |= ABOVE_DEAD;
        }
    }
    /* each live node's edges into dead nodes (and its EOS, where its value went) are cut; the
       nodes' destinations are read ahead (an update's first call finds them out of the caches,
       a node's edges a few lines each, the nodes far apart) */
    Py_ssize_t scanned = 0;
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        if (!(flags[i] & DEAD_NODE) && (flags[i] & (OWN | ABOVE_DEAD))) {
            order[scanned++] = i;
        }
    }
    for (Py_ssize_t m = 0; !failed && m < scanned; m++) {
        Py_ssize_t i = order[m];
        Edges e;
        if (m + SCAN_AHEAD < scanned) {
            node_edges(k, at[order[m + SCAN_AHEAD]].node, &e);
            for (int32_t j = 0; j < e.count; j += 16) {
                PREFETCH(e.dests + j);
            }
        }
        node_edges(k, at[i].node, &e);
        int64_t before = tokens->size;
        for (int32_t j = 0; j < e.count && !failed; j++) {
            int32_t dest = e.dests[j];
            int drop = dest >= 0 && dest < k->num_nodes && (dead_bits[dest >> 6] >> (dest & 63)) & 1;
            for (Py_ssize_t q = 0; (flags[i] & OWN) && !drop && q < n_eos; q++) {
                drop = e.tokens[j] == eos[q];
            }
            failed = drop && ints_append(tokens, e.tokens[j]) < 0;
        }
        if (tokens->size > before && !failed) {
            failed = ints_append(cut, (int32_t)at[i].node) < 0 || ints_append(offsets, (int32_t)tokens->size) < 0;
        }
    }
    free(counts), free(order), free(dead_bits);
    return failed ? -1 : 0;
}

/* tombstone_edges(kernel, paths, lengths, single, eos, by_eos, terminal_nodes, terminal_values, initial)
 *   -> (cut nodes, offsets, cut tokens) as int32 bytes, and the removed values' indices as int64
 *      bytes (ascending, distinct)
 * paths, lengths: the removed values' walks (walk_paths's: int64, values x (longest + 1), each
 * in the trie to its value's node); single: uint8 by token id up to the largest single-byte
 * token's (one per byte), 1 for them; eos: the EOS ids (int64); where the values end: by_eos
 * (an EOS id, an edge to the final state of each value) or -1 and terminal_nodes,
 * terminal_values (the node each value ends at, ascending, and the value's index; int32). A
 * node on the walks is dead when it keeps no value and every child is dead (counted deepest
 * first; a child is the target of a single-byte token); a live node loses its edges into dead
 * nodes, and a removed value's own node its EOS edges. See _tombstones in sets/update.py, the
 * reference. */
static PyObject *tombstone_edges(PyObject *module, PyObject *args) {
    PyObject *kernel_obj, *objs[6];
    long long initial, by_eos;
    if (!PyArg_ParseTuple(args, "O!OOOOLOOL", &KernelType, &kernel_obj, &objs[0], &objs[1], &objs[2], &objs[3],
                          &by_eos, &objs[4], &objs[5], &initial)) {
        return NULL;
    }
    const Kernel *k = (const Kernel *)kernel_obj;
    Py_buffer views[6];
    static const Py_ssize_t sizes[6] = {8, 8, 1, 8, 4, 4};
    static const char *names[6] = {"paths", "lengths", "single", "eos", "terminal_nodes", "terminal_values"};
    int held = 0;
    PyObject *result = NULL;
    uint64_t *removed = NULL; /* (freed at done:) */
    for (; held < 6; held++) {
        int got = held == 0 ? PyObject_GetBuffer(objs[0], &views[0], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
                            : get_array(objs[held], &views[held], sizes[held], names[held]);
        if (got < 0) {
            goto done;
        }
    }
    const int64_t *paths = (const int64_t *)views[0].buf, *lengths = (const int64_t *)views[1].buf;
    const ValueEnds ends = {by_eos, (const int32_t *)views[4].buf, (const int32_t *)views[5].buf, views[4].shape[0]};
    Py_ssize_t values = views[1].shape[0], columns = views[0].ndim == 2 ? views[0].shape[1] : -1;
    int bad = k->lazy != NULL || k->patch != NULL || views[0].itemsize != 8 || columns < 1 ||
              views[0].shape[0] != values || views[4].shape[0] != views[5].shape[0] || initial < 0 ||
              initial >= k->num_nodes || by_eos >= 32 * (long long)k->width;
    Py_ssize_t walked = 0;
    /* the removed values' indices, each walk checked first (in the trie, to a value's node) */
    removed = bad ? NULL : (uint64_t *)malloc((size_t)(values + 1) * sizeof(uint64_t));
    if (!bad && removed == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; !bad && i < values; i++) {
        bad = lengths[i] < 0 || lengths[i] >= columns;
        for (int64_t d = 0; !bad && d <= lengths[i]; d++) {
            int64_t node = paths[i * columns + d];
            bad = node < 0 || node >= k->num_nodes || (d == 0 && node != initial);
        }
        int64_t index = bad ? -1 : value_at(k, &ends, paths[i * columns + lengths[i]]);
        bad = bad || index < 0;
        removed[i] = (uint64_t)index;
        walked += lengths[i] + 1;
    }
    if (bad || walked >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "tombstone_edges: walks of an eager kernel, in its trie to their values");
        goto done;
    }
    /* the walks' nodes, distinct (sorted as node << 32 | where it was met), each with its
     * parent's index, OWN where a removed value ends */
    uint64_t *keys = (uint64_t *)malloc((size_t)(walked + 1) * sizeof(uint64_t));
    int64_t *met = (int64_t *)malloc((size_t)(walked + 1) * 2 * sizeof(int64_t)); /* parent, depth */
    PathNode *at = (PathNode *)malloc((size_t)(walked + 1) * sizeof(PathNode));
    Py_ssize_t *up = (Py_ssize_t *)malloc((size_t)(walked + 1) * sizeof(Py_ssize_t));
    uint8_t *flags = (uint8_t *)calloc((size_t)(walked + 1), 1);
    int64_t *nodes = (int64_t *)malloc((size_t)(walked + 1) * sizeof(int64_t));
    Int32s cut = {0}, offsets = {0}, tokens = {0};
    int failed = keys == NULL || met == NULL || at == NULL || up == NULL || flags == NULL || nodes == NULL ||
                 ints_append(&offsets, 0) < 0;
    Py_ssize_t n = 0, n_removed = 0;
    if (!failed) {
        for (Py_ssize_t i = 0, m = 0; i < values; i++) {
            const int64_t *row = paths + i * columns;
            for (int64_t d = 0; d <= lengths[i]; d++, m++) {
                keys[m] = (uint64_t)row[d] << 32 | (uint64_t)m;
                met[2 * m] = d > 0 ? row[d - 1] : -1;
                met[2 * m + 1] = d;
            }
        }
        sort_keys(keys, walked);
        for (Py_ssize_t m = 0; m < walked; m++) {
            int64_t node = (int64_t)(keys[m] >> 32), first = (int64_t)(keys[m] & 0xffffffffu);
            if (n == 0 || node != at[n - 1].node) {
                at[n] = (PathNode){node, met[2 * first], met[2 * first + 1]};
                nodes[n++] = node;
            }
        }
        sort_keys(removed, values);
        for (Py_ssize_t i = 0; i < values; i++) {
            if (n_removed == 0 || removed[i] != removed[n_removed - 1]) {
                removed[n_removed++] = removed[i];
            }
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            up[i] = at[i].parent >= 0 ? find_int64(nodes, n, at[i].parent) : -1;
        }
        for (Py_ssize_t i = 0; i < values; i++) {
            flags[find_int64(nodes, n, paths[i * columns + lengths[i]])] |= OWN;
        }
        failed = cut_edges(k, &ends, at, up, flags, n, &views[2], (const int64_t *)views[3].buf, views[3].shape[0],
                           initial, &cut, &offsets, &tokens) < 0;
    }
    if (failed) {
        PyErr_NoMemory();
    } else {
        const void *parts[4] = {cut.data, offsets.data, tokens.data, removed};
        Py_ssize_t bytes[4] = {4 * cut.size, 4 * offsets.size, 4 * tokens.size, 8 * n_removed};
        result = PyTuple_New(4);
        for (int i = 0; result != NULL && i < 4; i++) {
            PyObject *made = PyBytes_FromStringAndSize((const char *)parts[i], bytes[i]);
            if (made == NULL) {
                Py_CLEAR(result);
            } else {
                PyTuple_SET_ITEM(result, i, made);
            }
        }
    }
    free(keys), free(met), free(at), free(up), free(flags), free(nodes);
    free(cut.data), free(offsets.data), free(tokens.data);
done:
    free(removed);
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
    }
    return result;
}

/* partner_nodes(delta, values, byte_tokens, base_paths) -> int32 bytes: per delta node, the base
 * node spelling the same prefix (-1: none). values: the delta's values (a list of bytes), each
 * walked down the delta (its single-byte tokens, byte_tokens: int64 [256]) against its walk down
 * the base, base_paths (walk_paths's: int64, values x columns, DEAD past where it left the base),
 * which an update has already made: nothing of the base is read again. See _partners in
 * sets/update.py, the reference. */
static PyObject *partner_nodes(PyObject *module, PyObject *args) {
    PyObject *delta_obj, *values, *objs[2];
    if (!PyArg_ParseTuple(args, "O!O!OO", &KernelType, &delta_obj, &PyList_Type, &values, &objs[0], &objs[1])) {
        return NULL;
    }
    const Kernel *d = (const Kernel *)delta_obj;
    Py_buffer byte_tokens, paths;
    if (get_array(objs[0], &byte_tokens, 8, "byte_tokens") < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(objs[1], &paths, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&byte_tokens);
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(values), columns = paths.ndim == 2 ? paths.shape[1] : -1;
    int ok = !d->lazy && !d->patch && d->num_nodes >= 1 && byte_tokens.shape[0] == 256 && paths.itemsize == 8 &&
             columns >= 1 && paths.shape[0] == count;
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        ok = PyBytes_Check(value) && PyBytes_GET_SIZE(value) < columns;
    }
    PyObject *result = NULL;
    char *data;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "partner_nodes: an eager delta, its values as bytes, their base walks");
    } else if ((result = new_bytes(d->num_nodes * 4, &data)) != NULL) {
        int32_t *partner = (int32_t *)data;
        const int64_t *tokens = (const int64_t *)byte_tokens.buf, *base = (const int64_t *)paths.buf;
        for (int64_t i = 0; i < d->num_nodes; i++) {
            partner[i] = -1;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            const uint8_t *bytes = (const uint8_t *)PyBytes_AS_STRING(PyList_GET_ITEM(values, i));
            const int64_t *row = base + i * columns;
            int64_t node = 0; /* (the delta's root, the base's at row[0]) */
            for (Py_ssize_t at = 0; node >= 0 && node < d->num_nodes; at++) {
                partner[node] = row[at] >= -1 && row[at] < INT32_MAX ? (int32_t)row[at] : -1;
                node = at < PyBytes_GET_SIZE(PyList_GET_ITEM(values, i)) ? walk_next(d, node, tokens[bytes[at]]) : -1;
            }
        }
    }
    PyBuffer_Release(&byte_tokens);
    PyBuffer_Release(&paths);
    return result;
}
