/* ------------------------------------------------------------------ incremental updates */

/* What with_values (triemask.sets.update) asks of the base automaton's kernel: the removed
 * values' walks down the trie, and the tombstone pass over the nodes on them. The NumPy code
 * in sets/update.py is the reference; these take the same inputs and give the same outputs. */

/* walk_paths(kernel, tokens int64 (values x longest), lengths int64, initial) -> paths bytes:
 * int64 (values x (longest + 1)), paths[i, d] the state after the first d tokens of value i,
 * DEAD (-1) from where it leaves the trie or past its length. */
static PyObject *walk_paths(PyObject *module, PyObject *args) {
    PyObject *kernel_obj, *tokens_obj, *lengths_obj;
    long long initial;
    if (!PyArg_ParseTuple(args, "O!OOL", &KernelType, &kernel_obj, &tokens_obj, &lengths_obj, &initial)) {
        return NULL;
    }
    const Kernel *k = (const Kernel *)kernel_obj;
    Py_buffer tokens, lengths;
    if (PyObject_GetBuffer(tokens_obj, &tokens, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(lengths_obj, &lengths, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&tokens);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t count = lengths.ndim == 1 ? lengths.shape[0] : -1;
    Py_ssize_t longest = tokens.ndim == 2 ? tokens.shape[1] : -1;
    const int64_t *len = (const int64_t *)lengths.buf;
    int ok = k->lazy == NULL && k->patch == NULL && tokens.itemsize == 8 && lengths.itemsize == 8 && count >= 0 &&
             longest >= 0 && tokens.shape[0] == count && valid_state(k, initial);
    for (Py_ssize_t i = 0; ok && i < count; i++) {
        ok = len[i] >= 0 && len[i] <= longest;
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "walk_paths: an eager kernel, int64 tokens (values x longest) and lengths");
    } else {
        char *data;
        out = new_bytes((Py_ssize_t)count * (longest + 1) * 8, &data);
        if (out != NULL) {
            int64_t *paths = (int64_t *)data;
            const int64_t *t = (const int64_t *)tokens.buf;
            Py_BEGIN_ALLOW_THREADS
            /* depth by depth across the values, not value by value: a step's lookups wait on the
             * memory of the node the previous step found, while the values' steps at one depth
             * are independent, so their cache misses overlap (2x on an automaton out of the caches) */
            for (Py_ssize_t i = 0; i < count; i++) {
                paths[i * (longest + 1)] = initial;
            }
            for (Py_ssize_t d = 0; d < longest; d++) {
                for (Py_ssize_t i = 0; i < count; i++) {
                    int64_t *row = paths + i * (longest + 1), state = row[d];
                    row[d + 1] = state >= 0 && d < len[i] ? plain_next(k, state, t[i * longest + d]) : -1;
                }
            }
            Py_END_ALLOW_THREADS
        }
    }
    PyBuffer_Release(&tokens);
    PyBuffer_Release(&lengths);
    return out;
}

/* tombstone_edges(kernel, nodes, parents, depths, indices, removed, single, eos, initial)
 *   -> (rewritten nodes, offsets, tokens, dests) as int32 bytes
 * The nodes on the removed values' paths (int64, ascending, distinct) with each one's parent
 * (-1 for the root), depth and value index (-1: none); the removed values' indices (int64,
 * ascending); single: uint8 per token id, 1 for the single-byte tokens (one per byte); eos:
 * the EOS ids (int64). A node is dead when it keeps no value and every child is dead (counted
 * deepest first; a child is the target of a single-byte token); a live node is rewritten
 * when an edge leads into a dead node or it is a removed value's own node (its EOS edges go).
 * See _tombstones in sets/update.py, the reference. */
static PyObject *tombstone_edges(PyObject *module, PyObject *args) {
    PyObject *kernel_obj, *objs[7];
    long long initial;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOL", &KernelType, &kernel_obj, &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &objs[6], &initial)) {
        return NULL;
    }
    const Kernel *k = (const Kernel *)kernel_obj;
    Py_buffer views[7];
    static const Py_ssize_t sizes[7] = {8, 8, 8, 8, 8, 1, 8};
    static const char *names[7] = {"nodes", "parents", "depths", "indices", "removed", "single", "eos"};
    int held = 0;
    PyObject *result = NULL;
    for (; held < 7; held++) {
        if (get_array(objs[held], &views[held], sizes[held], names[held]) < 0) {
            goto done;
        }
    }
    const int64_t *nodes = (const int64_t *)views[0].buf, *parents = (const int64_t *)views[1].buf;
    const int64_t *depths = (const int64_t *)views[2].buf, *indices = (const int64_t *)views[3].buf;
    const int64_t *removed = (const int64_t *)views[4].buf, *eos = (const int64_t *)views[6].buf;
    const uint8_t *single = (const uint8_t *)views[5].buf;
    Py_ssize_t n = views[0].shape[0], n_removed = views[4].shape[0], n_single = views[5].shape[0];
    Py_ssize_t n_eos = views[6].shape[0];
    int bad = k->lazy != NULL || k->patch != NULL || views[1].shape[0] != n || views[2].shape[0] != n ||
              views[3].shape[0] != n || n_single < 32 * k->width;
    for (Py_ssize_t i = 0; !bad && i < n; i++) {
        bad = nodes[i] < 0 || nodes[i] >= k->num_nodes || (i > 0 && nodes[i] <= nodes[i - 1]) || depths[i] < 0 ||
              depths[i] > INT32_MAX;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "tombstone_edges: path nodes of this eager kernel, ascending, one row each");
        goto done;
    }
    /* per path node: its children (single-byte edges), children on the paths, dead children */
    int64_t *counts = (int64_t *)PyMem_Calloc((size_t)(3 * n + 1), sizeof(int64_t));
    Py_ssize_t *order = (Py_ssize_t *)PyMem_Malloc((size_t)(n + 1) * sizeof(Py_ssize_t));
    uint8_t *dead = (uint8_t *)PyMem_Calloc((size_t)(n + 1), 1);
    Int32s rewritten = {0}, offsets = {0}, kept_tokens = {0}, kept_dests = {0};
    int failed = counts == NULL || order == NULL || dead == NULL || ints_append(&offsets, 0) < 0;
    int64_t *children = counts, *on_paths = counts + n, *dead_children = counts + 2 * n;
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        Py_ssize_t parent = parents[i] >= 0 ? find_int64(nodes, n, parents[i]) : -1;
        if (parent >= 0) {
            on_paths[parent]++;
        }
    }
    /* the nodes that may die (no value kept, every child on a path), deepest first; a node's
       children are counted only as far as telling whether they all lie on paths */
    Py_ssize_t maybe = 0;
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        int keeps = indices[i] >= 0 && find_int64(removed, n_removed, indices[i]) < 0;
        if (keeps || nodes[i] == initial) {
            continue;
        }
        Edges e;
        node_edges(k, nodes[i], &e); /* (eager: cannot fail) */
        for (int32_t j = 0; j < e.count && children[i] <= on_paths[i]; j++) {
            children[i] += single[e.tokens[j]] != 0;
        }
        if (children[i] <= on_paths[i]) {
            order[maybe++] = i;
        }
    }
    if (!failed && maybe > 1) { /* by depth, deepest first, stable: a counting sort (depths are short) */
        int64_t deepest = 0;
        for (Py_ssize_t m = 0; m < maybe; m++) {
            deepest = depths[order[m]] > deepest ? depths[order[m]] : deepest;
        }
        Py_ssize_t *starts = (Py_ssize_t *)PyMem_Calloc((size_t)deepest + 2, sizeof(Py_ssize_t));
        Py_ssize_t *sorted = (Py_ssize_t *)PyMem_Malloc((size_t)maybe * sizeof(Py_ssize_t));
        failed = starts == NULL || sorted == NULL;
        for (Py_ssize_t m = 0; !failed && m < maybe; m++) {
            starts[deepest - depths[order[m]] + 1]++;
        }
        for (int64_t d = 1; !failed && d <= deepest + 1; d++) {
            starts[d] += starts[d - 1];
        }
        for (Py_ssize_t m = 0; !failed && m < maybe; m++) {
            sorted[starts[deepest - depths[order[m]]]++] = order[m];
        }
        if (!failed) {
            memcpy(order, sorted, (size_t)maybe * sizeof(Py_ssize_t));
        }
        PyMem_Free(starts), PyMem_Free(sorted);
    }
    for (Py_ssize_t m = 0; !failed && m < maybe; m++) {
        Py_ssize_t i = order[m];
        if (dead_children[i] == children[i]) {
            dead[i] = 1;
            Py_ssize_t parent = parents[i] >= 0 ? find_int64(nodes, n, parents[i]) : -1;
            if (parent >= 0) {
                dead_children[parent]++;
            }
        }
    }
    /* each live node's edges without those into dead nodes (and its EOS, where its value went);
       the dead nodes as bits by state id, so that an edge costs one test */
    uint64_t *dead_bits = failed ? NULL : (uint64_t *)PyMem_Calloc((size_t)(k->num_states / 64 + 1), 8);
    failed = failed || dead_bits == NULL;
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        if (dead[i]) {
            dead_bits[nodes[i] >> 6] |= (uint64_t)1 << (nodes[i] & 63);
        }
    }
    for (Py_ssize_t i = 0; !failed && i < n; i++) {
        if (dead[i]) {
            continue;
        }
        Edges e;
        node_edges(k, nodes[i], &e);
        int own = indices[i] >= 0 && find_int64(removed, n_removed, indices[i]) >= 0;
        int32_t dropped = 0;
        for (int pass = 0; pass < 2 && !failed; pass++) { /* count, then (if any went) keep the rest */
            int32_t *to_tokens = NULL, *to_dests = NULL;
            if (pass == 1) {
                if (!dropped) {
                    break;
                }
                int64_t kept = e.count - dropped;
                failed = ints_extend(&kept_tokens, kept) < 0 || ints_extend(&kept_dests, kept) < 0;
                if (failed) {
                    break;
                }
                to_tokens = kept_tokens.data + kept_tokens.size - kept;
                to_dests = kept_dests.data + kept_dests.size - kept;
            }
            for (int32_t j = 0; j < e.count; j++) {
                int32_t dest = e.dests[j];
                int drop = dest >= 0 && (dead_bits[dest >> 6] >> (dest & 63)) & 1;
                for (Py_ssize_t q = 0; own && !drop && q < n_eos; q++) {
                    drop = e.tokens[j] == eos[q];
                }
                if (pass == 0) {
                    dropped += drop;
                } else if (!drop) {
                    *to_tokens++ = e.tokens[j];
                    *to_dests++ = dest;
                }
            }
        }
        if (dropped && !failed) {
            failed = ints_append(&rewritten, (int32_t)nodes[i]) < 0 ||
                     ints_append(&offsets, (int32_t)kept_tokens.size) < 0;
        }
    }
    PyMem_Free(dead_bits);
    if (failed) {
        PyErr_NoMemory();
    } else {
        Int32s *parts[4] = {&rewritten, &offsets, &kept_tokens, &kept_dests};
        result = PyTuple_New(4);
        for (int i = 0; result != NULL && i < 4; i++) {
            PyObject *bytes = PyBytes_FromStringAndSize((const char *)parts[i]->data, (Py_ssize_t)parts[i]->size * 4);
            if (bytes == NULL) {
                Py_CLEAR(result);
            } else {
                PyTuple_SET_ITEM(result, i, bytes);
            }
        }
    }
    PyMem_Free(counts), PyMem_Free(order), PyMem_Free(dead);
    free(rewritten.data), free(offsets.data), free(kept_tokens.data), free(kept_dests.data);
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
    }
    return result;
}
