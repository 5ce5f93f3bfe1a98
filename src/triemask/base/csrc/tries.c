/* ------------------------------------------------------------------ tries */

typedef struct {
    const uint8_t *data;
    int64_t length;
    int64_t index; /* position in the input */
} Str;

static inline int char_at(const Str *s, int64_t depth) {
    return depth < s->length ? s->data[depth] : -1;
}

static int order_from(const Str *a, const Str *b, int64_t depth) {
    int64_t shared = (a->length < b->length ? a->length : b->length) - depth;
    int c = shared > 0 ? memcmp(a->data + depth, b->data + depth, (size_t)shared) : 0;
    if (c) {
        return c;
    }
    return (a->length > b->length) - (a->length < b->length);
}

static inline void swap_str(Str *a, Str *b) {
    Str t = *a;
    *a = *b;
    *b = t;
}

/* Multikey quicksort (Bentley and Sedgewick): strings sorted by bytes, with shared prefixes
   compared once per level rather than once per comparison. Not stable: equal strings may
   come in any order, which build_trie does not need. */
static void sort_strings(Str *a, int64_t n, int64_t depth) {
    while (n > 12) {
        int x = char_at(&a[0], depth), y = char_at(&a[n / 2], depth), z = char_at(&a[n - 1], depth);
        int pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t lt = 0, i = 0, gt = n;
        while (i < gt) {
            int c = char_at(&a[i], depth);
            if (c < pivot) {
                swap_str(&a[lt++], &a[i++]);
            } else if (c > pivot) {
                swap_str(&a[i], &a[--gt]);
            } else {
                i++;
            }
        }
        sort_strings(a, lt, depth);
        sort_strings(a + gt, n - gt, depth);
        if (pivot < 0) {
            return; /* the middle part is strings that end here: all equal */
        }
        a += lt; /* the middle part shares one more byte */
        n = gt - lt;
        depth++;
    }
    for (int64_t i = 1; i < n; i++) {
        for (int64_t j = i; j > 0 && order_from(&a[j - 1], &a[j], depth) > 0; j--) {
            swap_str(&a[j - 1], &a[j]);
        }
    }
}

/* MSD radix sort above RADIX_MIN strings (one pass reads each string's byte at this depth
 * into keys, then buckets), multikey quicksort below: the byte reads, scattered over the
 * input, are the cost, and a radix pass does one per string per level. The largest bucket
 * is looped on, the others recursed into (at most half as large), so the stack stays
 * logarithmic however long the shared prefixes. scratch and keys hold n entries. */
enum { RADIX_MIN = 1024 };

static void radix_sort_strings(Str *a, int64_t n, int64_t depth, Str *scratch, uint16_t *keys) {
    while (n >= RADIX_MIN) {
        int64_t start[258] = {0}; /* key 0: the string ends here; 1 + byte otherwise */
        for (int64_t i = 0; i < n; i++) {
            keys[i] = (uint16_t)(char_at(&a[i], depth) + 1);
            start[keys[i] + 1]++;
        }
        for (int b = 0; b < 257; b++) {
            start[b + 1] += start[b];
        }
        int64_t cursor[257];
        memcpy(cursor, start, sizeof(cursor));
        for (int64_t i = 0; i < n; i++) {
            scratch[cursor[keys[i]]++] = a[i];
        }
        memcpy(a, scratch, (size_t)n * sizeof(Str));
        int largest = 1; /* strings that end here (key 0) are equal: sorted */
        for (int b = 2; b < 257; b++) {
            largest = start[b + 1] - start[b] > start[largest + 1] - start[largest] ? b : largest;
        }
        for (int b = 1; b < 257; b++) {
            if (b != largest && start[b + 1] - start[b] > 1) {
                radix_sort_strings(a + start[b], start[b + 1] - start[b], depth + 1, scratch, keys);
            }
        }
        a += start[largest];
        n = start[largest + 1] - start[largest];
        depth++;
    }
    sort_strings(a, n, depth);
}

/* build_trie(flat uint8, starts int64[k + 1], want_inverse)
 *   -> (parent int32, byte uint8, level_offsets int64, terminal int32, flat uint8, starts int64,
 *       inverse int64 | None) as bytearrays
 * The breadth-first trie of _trie.build_trie: distinct strings sorted (bytes order), nodes
 * numbered by depth and, within a depth, in the order of the strings that create them. */
static PyObject *build_trie(PyObject *module, PyObject *args) {
    PyObject *flat_obj, *starts_obj;
    int want_inverse;
    if (!PyArg_ParseTuple(args, "OOp", &flat_obj, &starts_obj, &want_inverse)) {
        return NULL;
    }
    Py_buffer flat, starts;
    if (get_array(flat_obj, &flat, 1, "flat") < 0) {
        return NULL;
    }
    if (get_array(starts_obj, &starts, 8, "starts") < 0) {
        PyBuffer_Release(&flat);
        return NULL;
    }
    PyObject *result = NULL, *outs[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    Str *order = NULL;
    int64_t *pre_parent = NULL, *pre_depth = NULL, *bfs = NULL, *path = NULL, *level_count = NULL, *distinct_of = NULL;
    uint8_t *pre_byte = NULL;
    const uint8_t *data = (const uint8_t *)flat.buf;
    const int64_t *st = (const int64_t *)starts.buf;
    Py_ssize_t k = starts.shape[0] - 1;
    int ok = k >= 1 && st[0] == 0 && st[k] == flat.shape[0];
    int64_t longest = 0;
    for (Py_ssize_t i = 0; ok && i < k; i++) {
        ok = st[i + 1] >= st[i];
        if (ok && st[i + 1] - st[i] > longest) {
            longest = st[i + 1] - st[i];
        }
    }
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "build_trie: starts must rise from 0 to len(flat)");
        goto done;
    }
    order = (Str *)PyMem_Malloc((size_t)k * sizeof(Str));
    distinct_of = (int64_t *)PyMem_Malloc((size_t)k * sizeof(int64_t));
    path = (int64_t *)PyMem_Malloc((size_t)(longest + 1) * sizeof(int64_t));
    level_count = (int64_t *)PyMem_Calloc((size_t)longest + 2, sizeof(int64_t));
    /* at most one node per input byte, plus the root */
    pre_parent = (int64_t *)PyMem_Malloc((size_t)(flat.shape[0] + 1) * sizeof(int64_t));
    pre_depth = (int64_t *)PyMem_Malloc((size_t)(flat.shape[0] + 1) * sizeof(int64_t));
    bfs = (int64_t *)PyMem_Malloc((size_t)(flat.shape[0] + 1) * sizeof(int64_t));
    pre_byte = (uint8_t *)PyMem_Malloc((size_t)(flat.shape[0] + 1));
    if (!order || !distinct_of || !path || !level_count || !pre_parent || !pre_depth || !bfs || !pre_byte) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t nodes = 1, distinct = 0, distinct_bytes = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < k; i++) {
        order[i] = (Str){data + st[i], st[i + 1] - st[i], i};
    }
    Str *scratch = k >= RADIX_MIN ? (Str *)malloc((size_t)k * sizeof(Str)) : NULL;
    uint16_t *keys = k >= RADIX_MIN ? (uint16_t *)malloc((size_t)k * sizeof(uint16_t)) : NULL;
    if (scratch != NULL && keys != NULL) {
        radix_sort_strings(order, (int64_t)k, 0, scratch, keys);
    } else {
        sort_strings(order, (int64_t)k, 0); /* small, or no memory for the radix pass */
    }
    free(scratch);
    free(keys);
    pre_parent[0] = 0;
    pre_depth[0] = 0;
    pre_byte[0] = 0;
    path[0] = 0;
    level_count[0] = 1;
    for (Py_ssize_t i = 0; i < k; i++) {
        const Str *s = &order[i];
        int64_t lcp = 0;
        if (i > 0) {
            const Str *p = &order[i - 1];
            int64_t shared = s->length < p->length ? s->length : p->length;
            while (lcp < shared && s->data[lcp] == p->data[lcp]) {
                lcp++;
            }
            if (lcp == s->length && lcp == p->length) { /* a duplicate */
                distinct_of[s->index] = distinct - 1;
                continue;
            }
        }
        for (int64_t d = lcp + 1; d <= s->length; d++) {
            pre_parent[nodes] = path[d - 1];
            pre_depth[nodes] = d;
            pre_byte[nodes] = s->data[d - 1];
            level_count[d]++;
            path[d] = nodes++;
        }
        distinct_of[s->index] = distinct;
        order[distinct] = *s; /* compact the distinct strings to the front, in order */
        order[distinct].index = path[s->length]; /* now: the preorder id of its terminal node */
        distinct++;
        distinct_bytes += s->length;
    }
    Py_END_ALLOW_THREADS
    char *buffers[7];
    int64_t levels = 0;
    while (levels <= longest && level_count[levels]) {
        levels++;
    }
    outs[0] = new_bytes(nodes * 4, &buffers[0]);
    outs[1] = new_bytes(nodes, &buffers[1]);
    outs[2] = new_bytes((levels + 1) * 8, &buffers[2]);
    outs[3] = new_bytes(distinct * 4, &buffers[3]);
    outs[4] = new_bytes(distinct_bytes, &buffers[4]);
    outs[5] = new_bytes((distinct + 1) * 8, &buffers[5]);
    if (want_inverse) {
        outs[6] = new_bytes(k * 8, &buffers[6]);
    }
    for (int i = 0; i < 7; i++) {
        if (outs[i] == NULL && (i < 6 || want_inverse)) {
            goto done;
        }
    }
    if (nodes >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 trie nodes: split the set");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    int64_t *level_offsets = (int64_t *)buffers[2];
    level_offsets[0] = 0;
    for (int64_t d = 0; d < levels; d++) {
        level_offsets[d + 1] = level_offsets[d] + level_count[d];
        level_count[d] = level_offsets[d]; /* the next free id of each depth */
    }
    for (int64_t p = 0; p < nodes; p++) { /* preorder is lexicographic: stable by depth = BFS */
        bfs[p] = level_count[pre_depth[p]]++;
    }
    int32_t *parent = (int32_t *)buffers[0];
    uint8_t *byte = (uint8_t *)buffers[1];
    for (int64_t p = 0; p < nodes; p++) {
        parent[bfs[p]] = (int32_t)bfs[pre_parent[p]];
        byte[bfs[p]] = pre_byte[p];
    }
    int32_t *terminal = (int32_t *)buffers[3];
    uint8_t *out_flat = (uint8_t *)buffers[4];
    int64_t *out_starts = (int64_t *)buffers[5];
    out_starts[0] = 0;
    for (int64_t i = 0; i < distinct; i++) {
        terminal[i] = (int32_t)bfs[order[i].index];
        if (order[i].length) {
            memcpy(out_flat + out_starts[i], order[i].data, (size_t)order[i].length);
        }
        out_starts[i + 1] = out_starts[i] + order[i].length;
    }
    if (want_inverse) {
        memcpy(buffers[6], distinct_of, (size_t)k * sizeof(int64_t));
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(7, outs[0], outs[1], outs[2], outs[3], outs[4], outs[5], want_inverse ? outs[6] : Py_None);
done:
    PyBuffer_Release(&flat);
    PyBuffer_Release(&starts);
    for (int i = 0; i < 7; i++) {
        Py_XDECREF(outs[i]);
    }
    PyMem_Free(order);
    PyMem_Free(distinct_of);
    PyMem_Free(path);
    PyMem_Free(level_count);
    PyMem_Free(pre_parent);
    PyMem_Free(pre_depth);
    PyMem_Free(bfs);
    PyMem_Free(pre_byte);
    return result;
}

/* build_hash(keys uint64, values uint64, bits) -> table uint64[2**bits] (a bytearray)
 * The token index's open-addressing table (see _token_index._build_hash): key << 32 | value
 * at the Fibonacci-hashed slot of key, linear probing. Keys below 2**32, distinct. */
static PyObject *build_hash(PyObject *module, PyObject *args) {
    PyObject *keys_obj, *values_obj;
    int bits;
    if (!PyArg_ParseTuple(args, "OOi", &keys_obj, &values_obj, &bits)) {
        return NULL;
    }
    Py_buffer keys, values;
    if (get_array(keys_obj, &keys, 8, "keys") < 0) {
        return NULL;
    }
    if (get_array(values_obj, &values, 8, "values") < 0) {
        PyBuffer_Release(&keys);
        return NULL;
    }
    PyObject *out = NULL;
    Py_ssize_t n = keys.shape[0];
    if (values.shape[0] != n || bits < 1 || bits > 40 || ((int64_t)1 << bits) <= n) {
        PyErr_SetString(PyExc_ValueError, "build_hash: inconsistent arrays");
        goto done;
    }
    const uint64_t *k = (const uint64_t *)keys.buf, *v = (const uint64_t *)values.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (k[i] >= ((uint64_t)1 << 32) || v[i] >= ((uint64_t)1 << 32)) {
            PyErr_SetString(PyExc_ValueError, "build_hash: keys and values must be below 2**32");
            goto done;
        }
    }
    char *data;
    int64_t size = (int64_t)1 << bits;
    out = new_bytes(size * 8, &data);
    if (out == NULL) {
        goto done;
    }
    uint64_t *table = (uint64_t *)data, mask = (uint64_t)size - 1;
    Py_BEGIN_ALLOW_THREADS
    memset(table, 0xFF, (size_t)size * 8);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t slot = (k[i] * 0x9E3779B97F4A7C15ULL) >> (64 - bits);
        while (table[slot] != UINT64_MAX) {
            slot = (slot + 1) & mask;
        }
        table[slot] = (k[i] << 32) | v[i];
    }
    Py_END_ALLOW_THREADS
done:
    PyBuffer_Release(&keys);
    PyBuffer_Release(&values);
    return out;
}

