/* ------------------------------------------------------------------ matching an acyclic automaton */

/* match_dag(tables, in_offsets i64[n + 1], source i32[E], byte u8[E], accepting i32[K], eos_ids i64,
 *           vocab_size, max_edges, max_work, mode)
 *   -> (edge_offsets int32[n + 2], edge_tokens int32, edge_dests int32, spelled int32) as
 *      bytearrays (spelled: the distinct text tokens on the edges, ascending), or the str
 *      "edges" / "work" as soon as the text edges pass max_edges / the edges the walk tries
 *      pass max_work (each -1: no limit; the reference's counts), before the large allocations
 *
 * match_trie for a deterministic acyclic byte automaton (see triemask.sets.matching.match_dag):
 * nodes are numbered so that every edge leads to a higher id, edges sorted by destination (the
 * edges into m are in_offsets[m] .. in_offsets[m + 1]). For every edge a -b-> m the walk goes up
 * the automaton while the bytes a .. m read backwards are a path of the token index, fanning out
 * over the edges into a; a token ending there is the edge a --token--> m. Determinism keeps the
 * triples (a, suffix, m) distinct.
 *
 * mode 0 chooses, 1 forces bytes, 2 forces classes. Bytes that label exactly the same
 * (source, destination) pairs are interchangeable (the 22 of [0-9A-Fa-f]); where such classes
 * merge at least half of the bytes used (match_dag_by_class), the walk runs over a small trie of
 * the token suffixes' *class strings* instead, built once from the index (only suffixes whose
 * bytes the automaton uses, as long as its longest path, along class pairs that follow each other
 * somewhere in it), and each class string found stands for every token that spells it.
 *
 * The answer's CSR is the NumPy compiler's: rows by source, tokens ascending within a row (a row's
 * tokens are distinct by determinism, but for an EOS id that is also a text token, sorted then). */

/* An open-addressing map from uint64 keys (never UINT64_MAX) to int32, grown at half load. */
typedef struct {
    uint64_t *keys;
    int32_t *values;
    uint64_t mask;
    int64_t count;
} IntMap;

static int map_init(IntMap *m, uint64_t capacity) {
    m->keys = (uint64_t *)malloc(capacity * sizeof(uint64_t));
    m->values = (int32_t *)malloc(capacity * sizeof(int32_t));
    if (m->keys == NULL || m->values == NULL) {
        return -1;
    }
    memset(m->keys, 0xFF, capacity * sizeof(uint64_t));
    m->mask = capacity - 1, m->count = 0;
    return 0;
}

static inline uint64_t map_slot(const IntMap *m, uint64_t key) {
    return (key * 0x9E3779B97F4A7C15ULL >> 17) & m->mask;
}

static inline int32_t map_get(const IntMap *m, uint64_t key, int32_t missing) {
    for (uint64_t slot = map_slot(m, key);; slot = (slot + 1) & m->mask) {
        if (m->keys[slot] == key) {
            return m->values[slot];
        }
        if (m->keys[slot] == UINT64_MAX) {
            return missing;
        }
    }
}

/* The value of `key`, inserting `fresh` when absent (*added set); -1 for no memory. */
static int32_t map_get_or_put(IntMap *m, uint64_t key, int32_t fresh, int *added) {
    uint64_t slot = map_slot(m, key);
    for (; m->keys[slot] != UINT64_MAX; slot = (slot + 1) & m->mask) {
        if (m->keys[slot] == key) {
            *added = 0;
            return m->values[slot];
        }
    }
    m->keys[slot] = key, m->values[slot] = fresh, m->count++;
    *added = 1;
    if (2 * (uint64_t)m->count > m->mask) {
        IntMap bigger;
        if (map_init(&bigger, 2 * (m->mask + 1)) < 0) {
            free(bigger.keys), free(bigger.values);
            return -1;
        }
        for (uint64_t i = 0; i <= m->mask; i++) {
            if (m->keys[i] != UINT64_MAX) {
                uint64_t s = map_slot(&bigger, m->keys[i]);
                while (bigger.keys[s] != UINT64_MAX) {
                    s = (s + 1) & bigger.mask;
                }
                bigger.keys[s] = m->keys[i], bigger.values[s] = m->values[i];
            }
        }
        bigger.count = m->count;
        free(m->keys), free(m->values);
        *m = bigger;
    }
    return fresh;
}

/* The automaton the walk climbs: edges into each node (in_offsets), their sources and labels
 * (a byte, or a byte class). */
typedef struct {
    const int64_t *in_offsets;
    const int32_t *source;
    int32_t *label;
    int32_t num_nodes;
} Climb;

/* Where the walk stands in the token suffixes: the token index (bytes) or the class-string trie. */
typedef struct {
    const Tables *tables;
    int by_class;
    int64_t classes;    /* k */
    IntMap child;       /* class node * k + class -> class node */
    uint8_t *branches;  /* per class node: it has a child */
    int64_t *group_offsets; /* tokens spelling each class string: group_tokens[group_offsets[c] ..] */
    int32_t *group_tokens;
    int32_t sentinel;
} Suffixes;

static inline int32_t suffix_child(const Suffixes *s, int32_t u, int32_t label) {
    if (!s->by_class) {
        return index_child(&s->tables->ix, u, (uint8_t)label);
    }
    return map_get(&s->child, (uint64_t)u * (uint64_t)s->classes + (uint64_t)label, s->sentinel);
}

static inline int suffix_branches(const Suffixes *s, int32_t u) {
    return s->by_class ? s->branches[u] : ((const uint8_t *)s->tables->views[3].buf)[u];
}

/* Bytes that label the same (source, destination) pairs, in the same order (edges are sorted by
 * destination, source, byte): class[b] (-1 where b labels no edge). Returns the number of
 * classes, or -1 when they merge fewer than half of the bytes used (or no memory: *failed). */
static int byte_classes(const int32_t *source, const uint8_t *byte, const int64_t *in_offsets, int32_t n,
                        int64_t edges, int32_t classes[256], int *failed) {
    int64_t count[257] = {0};
    for (int64_t e = 0; e < edges; e++) {
        count[byte[e] + 1]++;
    }
    for (int b = 0; b < 256; b++) {
        count[b + 1] += count[b];
    }
    uint64_t *pairs = (uint64_t *)malloc((size_t)(edges > 0 ? edges : 1) * sizeof(uint64_t));
    if (pairs == NULL) {
        *failed = 1;
        return -1;
    }
    int64_t cursor[256];
    memcpy(cursor, count, sizeof(cursor));
    for (int32_t m = 0; m < n; m++) {
        for (int64_t e = in_offsets[m]; e < in_offsets[m + 1]; e++) {
            pairs[cursor[byte[e]]++] = (uint64_t)(uint32_t)source[e] << 32 | (uint32_t)m;
        }
    }
    int used = 0, k = 0, representative[256];
    for (int b = 0; b < 256; b++) {
        classes[b] = -1;
        int64_t size = count[b + 1] - count[b];
        if (size == 0) {
            continue;
        }
        used++;
        for (int c = 0; c < k && classes[b] < 0; c++) {
            int r = representative[c];
            if (count[r + 1] - count[r] == size &&
                memcmp(pairs + count[r], pairs + count[b], (size_t)size * sizeof(uint64_t)) == 0) {
                classes[b] = c;
            }
        }
        if (classes[b] < 0) {
            representative[k] = b;
            classes[b] = k++;
        }
    }
    free(pairs);
    return 2 * k > used ? -1 : k;
}

/* The class-labelled automaton (one edge per source, class and destination) into `out`. */
static int class_climb(const Climb *bytes, const int32_t classes[256], Climb *out, int64_t **offsets_out,
                       int32_t **source_out) {
    int32_t n = bytes->num_nodes;
    int64_t edges = bytes->in_offsets[n];
    int64_t *offsets = (int64_t *)malloc(((size_t)n + 1) * sizeof(int64_t));
    int32_t *source = (int32_t *)malloc((size_t)(edges > 0 ? edges : 1) * sizeof(int32_t));
    int32_t *label = (int32_t *)malloc((size_t)(edges > 0 ? edges : 1) * sizeof(int32_t));
    *offsets_out = offsets, *source_out = source, out->label = label;
    if (offsets == NULL || source == NULL || label == NULL) {
        return -1;
    }
    int64_t stamp[256], at = 0, group = 0;
    for (int c = 0; c < 256; c++) {
        stamp[c] = -1;
    }
    offsets[0] = 0;
    for (int32_t m = 0; m < n; m++) {
        for (int64_t e = bytes->in_offsets[m]; e < bytes->in_offsets[m + 1]; e++) {
            if (e == bytes->in_offsets[m] || bytes->source[e] != bytes->source[e - 1]) {
                group++; /* a new (destination, source): its classes are new again */
            }
            int32_t c = classes[bytes->label[e]];
            if (stamp[c] != group) {
                stamp[c] = group;
                source[at] = bytes->source[e], label[at] = c, at++;
            }
        }
        offsets[m + 1] = at;
    }
    out->in_offsets = offsets, out->source = source, out->num_nodes = n;
    return 0;
}

/* The trie of the class strings of token suffixes (read backwards, as the index stores them),
 * with the tokens that spell each: see the header. Returns 0, or -1 for no memory. */
static int class_suffixes(Suffixes *s, const Climb *climb, const int32_t classes[256], int k, int32_t longest) {
    const Tables *t = s->tables;
    const int32_t *first_token = (const int32_t *)t->views[2].buf;
    const int64_t *dup_off = t->have_dups ? (const int64_t *)t->views[4].buf : NULL;
    const int32_t *dup_tok = t->have_dups ? (const int32_t *)t->views[5].buf : NULL;
    int32_t n = climb->num_nodes;
    /* follows[b] bit c: some node has an edge of class b in and one of class c out, so b may
       come right before c in a string the automaton reads */
    uint64_t follows[256][4], *outs = (uint64_t *)calloc((size_t)n * 4, sizeof(uint64_t));
    if (outs == NULL) {
        return -1;
    }
    memset(follows, 0, sizeof(follows));
    for (int32_t m = 0; m < n; m++) {
        for (int64_t e = climb->in_offsets[m]; e < climb->in_offsets[m + 1]; e++) {
            int32_t c = climb->label[e];
            outs[(int64_t)climb->source[e] * 4 + c / 64] |= 1ULL << (c % 64);
        }
    }
    for (int32_t m = 0; m < n; m++) {
        for (int64_t e = climb->in_offsets[m]; e < climb->in_offsets[m + 1]; e++) {
            for (int w = 0; w < 4; w++) {
                follows[climb->label[e]][w] |= outs[(int64_t)m * 4 + w];
            }
        }
    }
    free(outs);
    /* the bytes that may come before a string starting with class `last` (row k: any string) */
    uint8_t *before = (uint8_t *)malloc(((size_t)k + 1) * 256);
    int16_t *before_count = (int16_t *)calloc((size_t)k + 1, sizeof(int16_t));
    for (int last = 0; before != NULL && before_count != NULL && last <= k; last++) {
        for (int b = 0; b < 256; b++) {
            int c = classes[b];
            if (c >= 0 && (last == k || follows[c][last / 64] >> (last % 64) & 1)) {
                before[last * 256 + before_count[last]++] = (uint8_t)b;
            }
        }
    }
    /* depth first over the index: (index node, class node, the class that starts the string, depth);
       a node's children are read from its list, or looked up byte by byte where it has more
       children than bytes may come before (the index root has every byte) */
    Int32s stack = {0}, tokens = {0};
    uint8_t *branches = NULL;
    int64_t nodes = 1, branches_cap = 0;
    int failed = before == NULL || before_count == NULL || map_init(&s->child, 1024) < 0 ||
                 ints_push(&stack, 4, 0, 0, k, 0) < 0;
    while (!failed && stack.size) {
        stack.size -= 4;
        int32_t u = stack.data[stack.size], cnode = stack.data[stack.size + 1], last = stack.data[stack.size + 2];
        int32_t depth = stack.data[stack.size + 3];
        if (depth >= longest) {
            continue;
        }
        int32_t first = t->child_offsets[u], children = t->child_offsets[u + 1] - first;
        int by_lookup = children > before_count[last];
        for (int32_t i = 0; !failed && i < (by_lookup ? before_count[last] : children); i++) {
            int32_t v = by_lookup ? index_child(&t->ix, u, before[last * 256 + i]) : first + i;
            if (v == t->ix.sentinel) {
                continue;
            }
            int32_t c = classes[t->node_byte[v]];
            if (c < 0 || (last < k && !(follows[c][last / 64] >> (last % 64) & 1))) {
                continue;
            }
            int added;
            uint64_t key = (uint64_t)cnode * (uint64_t)k + (uint64_t)c;
            int32_t child = map_get_or_put(&s->child, key, (int32_t)nodes, &added);
            if (child < 0 || nodes >= INT32_MAX - 1) {
                failed = 1;
                break;
            }
            if (added) {
                nodes++;
            }
            if (cnode >= branches_cap) {
                int64_t capacity = branches_cap ? 2 * branches_cap : 1024;
                while (capacity <= cnode) {
                    capacity *= 2;
                }
                uint8_t *grown = (uint8_t *)realloc(branches, (size_t)capacity);
                if (grown == NULL) {
                    failed = 1;
                    break;
                }
                memset(grown + branches_cap, 0, (size_t)(capacity - branches_cap));
                branches = grown, branches_cap = capacity;
            }
            branches[cnode] = 1;
            if (first_token[v] >= 0) {
                failed |= ints_push(&tokens, 2, child, first_token[v], 0, 0) < 0;
                for (int64_t d = dup_off ? dup_off[v] : 0; !failed && dup_off && d < dup_off[v + 1]; d++) {
                    failed |= ints_push(&tokens, 2, child, dup_tok[d], 0, 0) < 0;
                }
            }
            if (!failed && t->child_offsets[v + 1] > t->child_offsets[v]) {
                failed |= ints_push(&stack, 4, v, child, c, depth + 1) < 0;
            }
        }
    }
    free(stack.data), free(before), free(before_count);
    /* per class node: whether it has children, and its tokens (a counting sort of the pairs) */
    s->branches = (uint8_t *)calloc((size_t)nodes + 1, 1);
    s->group_offsets = (int64_t *)calloc((size_t)nodes + 2, sizeof(int64_t));
    int64_t pairs = tokens.size / 2;
    s->group_tokens = (int32_t *)malloc((size_t)(pairs > 0 ? pairs : 1) * sizeof(int32_t));
    if (failed || s->branches == NULL || s->group_offsets == NULL || s->group_tokens == NULL) {
        free(branches), free(tokens.data);
        return -1;
    }
    if (branches != NULL) {
        memcpy(s->branches, branches, (size_t)(branches_cap < nodes ? branches_cap : nodes));
    }
    free(branches);
    for (int64_t i = 0; i < pairs; i++) {
        s->group_offsets[tokens.data[2 * i] + 2]++;
    }
    for (int64_t c = 0; c <= nodes; c++) {
        s->group_offsets[c + 1] += s->group_offsets[c];
    }
    for (int64_t i = 0; i < pairs; i++) { /* group_offsets[c + 1] is c's cursor, then its end */
        s->group_tokens[s->group_offsets[tokens.data[2 * i] + 1]++] = tokens.data[2 * i + 1];
    }
    free(tokens.data);
    s->sentinel = (int32_t)nodes; /* no such class string: no tokens, no children */
    return 0;
}

/* The CSR of the found triples (source, token, destination) plus the EOS edges: rows by source
 * (a counting sort), tokens ascending within a row. A row of more than a 1024th of the vocabulary
 * is ordered through a bitmap of its tokens (reading the bitmap costs less than sorting then), a
 * smaller one by sorting its keys (token, destination). A (source, token) pair occurs twice only
 * for an EOS id that is also a text token: that row is sorted as keys, the NumPy compiler's order. */
static int dag_csr(const Int32s *found, int32_t n, const int32_t *accepting, Py_ssize_t k, const int64_t *eos_ids,
                   Py_ssize_t n_eos, int64_t vocab_size, int32_t *offsets, int32_t *tokens, int32_t *dests) {
    int64_t text = found->size / 3, total = text + (int64_t)k * n_eos;
    int64_t *cursor = (int64_t *)calloc((size_t)n + 1, sizeof(int64_t));
    uint64_t *keys = (uint64_t *)malloc((size_t)(total > 0 ? total : 1) * sizeof(uint64_t));
    uint64_t *seen = (uint64_t *)calloc((size_t)(vocab_size + 63) / 64, sizeof(uint64_t));
    int32_t *dest_of = (int32_t *)malloc((size_t)vocab_size * sizeof(int32_t));
    int failed = cursor == NULL || keys == NULL || seen == NULL || dest_of == NULL;
    if (!failed) {
        for (int64_t i = 0; i < text; i++) {
            cursor[found->data[3 * i]]++;
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            cursor[accepting[i]] += n_eos;
        }
        offsets[0] = 0;
        for (int32_t a = 0; a <= n; a++) {
            offsets[a + 1] = offsets[a] + (int32_t)(a < n ? cursor[a] : 0);
            cursor[a] = offsets[a];
        }
        for (int64_t i = 0; i < text; i++) {
            const int32_t *t = found->data + 3 * i;
            keys[cursor[t[0]]++] = (uint64_t)(uint32_t)t[1] << 32 | (uint32_t)t[2];
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            for (Py_ssize_t e = 0; e < n_eos; e++) {
                keys[cursor[accepting[i]]++] = (uint64_t)eos_ids[e] << 32 | (uint32_t)(n + i);
            }
        }
        for (int32_t a = 0; a < n; a++) {
            uint64_t *row = keys + offsets[a];
            int64_t size = offsets[a + 1] - offsets[a], lowest = vocab_size, highest = -1, i = 0;
            if (size * 1024 >= vocab_size) {
                for (; i < size; i++) {
                    int64_t token = (int64_t)(row[i] >> 32);
                    if (seen[token / 64] >> (token % 64) & 1) {
                        break; /* a token twice: sorted as keys below */
                    }
                    seen[token / 64] |= 1ULL << (token % 64);
                    dest_of[token] = (int32_t)(row[i] & 0xFFFFFFFFu);
                    lowest = token < lowest ? token : lowest, highest = token > highest ? token : highest;
                }
                for (int64_t w = lowest / 64, at = 0; highest >= 0 && w <= highest / 64; w++) {
                    for (uint64_t bits = seen[w]; bits && i == size; bits &= bits - 1) {
                        int64_t token = w * 64 + __builtin_ctzll(bits);
                        row[at++] = (uint64_t)token << 32 | (uint32_t)dest_of[token];
                    }
                    seen[w] = 0;
                }
            }
            if (i < size) {
                sort_keys(row, size);
            }
        }
        for (int64_t i = 0; i < total; i++) {
            tokens[i] = (int32_t)(keys[i] >> 32);
            dests[i] = (int32_t)(keys[i] & 0xFFFFFFFFu);
        }
    }
    free(cursor), free(keys), free(seen), free(dest_of);
    return failed ? -1 : 0;
}

static PyObject *match_dag(PyObject *module, PyObject *args) {
    PyObject *tables_obj, *objs[5];
    long long vocab_size, max_edges, max_work;
    int mode;
    if (!PyArg_ParseTuple(args, "O!OOOOOLLLi", &TablesType, &tables_obj, &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &vocab_size, &max_edges, &max_work, &mode)) {
        return NULL;
    }
    Tables *tables = (Tables *)tables_obj;
    if (!tables->ready) {
        PyErr_SetString(PyExc_ValueError, "match_dag: uninitialised Tables");
        return NULL;
    }
    Py_buffer in_view, source_view, byte_view, accepting_view, eos_view;
    Py_buffer *views[5] = {&in_view, &source_view, &byte_view, &accepting_view, &eos_view};
    static const Py_ssize_t sizes[5] = {8, 4, 1, 4, 8};
    static const char *names[5] = {"in_offsets", "source", "byte", "accepting", "eos_ids"};
    int held = 0;
    for (int i = 0; i < 5; i++) {
        if (get_array(objs[i], views[i], sizes[i], names[i]) < 0) {
            for (int j = 0; j < held; j++) {
                PyBuffer_Release(views[j]);
            }
            return NULL;
        }
        held = i + 1;
    }
    PyObject *result = NULL, *offsets_out = NULL, *tokens_out = NULL, *dests_out = NULL, *spelled_out = NULL;
    const int64_t *in_offsets = (const int64_t *)in_view.buf, *eos_ids = (const int64_t *)eos_view.buf;
    const int32_t *source = (const int32_t *)source_view.buf, *accepting = (const int32_t *)accepting_view.buf;
    const uint8_t *byte = (const uint8_t *)byte_view.buf;
    Py_ssize_t n = in_view.shape[0] - 1, edges = source_view.shape[0], k = accepting_view.shape[0];
    Py_ssize_t n_eos = eos_view.shape[0];
    int bad = n < 1 || byte_view.shape[0] != edges || n + k >= INT32_MAX || in_offsets[0] != 0 ||
              in_offsets[n] != edges || vocab_size < 1 || vocab_size >= INT32_MAX || mode < 0 || mode > 2;
    for (Py_ssize_t m = 0; !bad && m < n; m++) {
        bad |= in_offsets[m + 1] < in_offsets[m] || in_offsets[m + 1] > edges;
        for (int64_t e = in_offsets[m]; !bad && e < in_offsets[m + 1]; e++) {
            bad |= source[e] < 0 || source[e] >= m; /* every edge leads to a higher node: acyclic */
        }
    }
    for (Py_ssize_t i = 0; !bad && i < k; i++) {
        bad |= accepting[i] < 0 || accepting[i] >= n;
    }
    for (Py_ssize_t i = 0; !bad && i < n_eos; i++) {
        bad |= eos_ids[i] < 0 || eos_ids[i] >= vocab_size;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "match_dag: inconsistent arrays");
        goto done;
    }
    const int32_t *first_token = (const int32_t *)tables->views[2].buf;
    const int64_t *dup_off = tables->have_dups ? (const int64_t *)tables->views[4].buf : NULL;
    const int32_t *dup_tok = tables->have_dups ? (const int32_t *)tables->views[5].buf : NULL;
    Suffixes s = {.tables = tables, .sentinel = tables->ix.sentinel};
    Climb by_byte = {in_offsets, source, NULL, (int32_t)n}, by_class = {0};
    int64_t *class_offsets = NULL;
    int32_t *class_source = NULL, *depth = NULL;
    Int32s found = {0}, stack = {0};
    int failed = 0, over_edges = 0, over_work = 0, token_out_of_range = 0;
    int32_t classes[256];
    Py_BEGIN_ALLOW_THREADS
    by_byte.label = (int32_t *)malloc((size_t)(edges > 0 ? edges : 1) * sizeof(int32_t));
    depth = (int32_t *)calloc((size_t)n, sizeof(int32_t));
    failed = by_byte.label == NULL || depth == NULL;
    int32_t longest = 0; /* the longest path's bytes: suffixes longer than that match nothing */
    for (Py_ssize_t m = 0; !failed && m < n; m++) {
        for (int64_t e = in_offsets[m]; e < in_offsets[m + 1]; e++) {
            by_byte.label[e] = byte[e];
            depth[m] = depth[source[e]] + 1 > depth[m] ? depth[source[e]] + 1 : depth[m];
        }
        longest = depth[m] > longest ? depth[m] : longest;
    }
    int k_classes = -1;
    if (!failed && mode != 1) {
        k_classes = byte_classes(source, byte, in_offsets, (int32_t)n, edges, classes, &failed);
        if (k_classes < 0 && mode == 2 && !failed) { /* forced: every used byte its own class */
            k_classes = 0;
            for (int b = 0; b < 256; b++) {
                int used = 0;
                for (int64_t e = 0; e < edges && !used; e++) {
                    used = byte[e] == b;
                }
                classes[b] = used ? k_classes++ : -1;
            }
        }
    }
    const Climb *climb = &by_byte;
    if (!failed && k_classes > 0) {
        s.by_class = 1, s.classes = k_classes;
        failed = class_climb(&by_byte, classes, &by_class, &class_offsets, &class_source) < 0 ||
                 class_suffixes(&s, &by_class, classes, k_classes, longest) < 0;
        climb = &by_class;
    }
    /* the walk: a stack of (a, suffix) per destination m */
    int64_t work = 0;
    for (int32_t m = 0; !failed && !over_edges && !over_work && m < (int32_t)n; m++) {
        stack.size = 0;
        for (int64_t e = climb->in_offsets[m]; !failed && e < climb->in_offsets[m + 1]; e++) {
            int32_t u = suffix_child(&s, 0, climb->label[e]);
            if (u != s.sentinel) {
                failed |= ints_push(&stack, 2, climb->source[e], u, 0, 0) < 0;
            }
        }
        while (!failed && stack.size) {
            stack.size -= 2;
            int32_t a = stack.data[stack.size], u = stack.data[stack.size + 1];
            if (s.by_class) { /* every token of the class string, room made once */
                int64_t lo = s.group_offsets[u], count = s.group_offsets[u + 1] - lo;
                if (count && (failed = ints_reserve(&found, 3 * count) < 0) == 0) {
                    int32_t *at = found.data + found.size;
                    for (int64_t g = 0; g < count; g++, at += 3) {
                        at[0] = a, at[1] = s.group_tokens[lo + g], at[2] = m;
                    }
                    found.size += 3 * count;
                }
            } else if (first_token[u] >= 0) {
                failed |= ints_push(&found, 3, a, first_token[u], m, 0) < 0;
                for (int64_t d = dup_off ? dup_off[u] : 0; !failed && dup_off && d < dup_off[u + 1]; d++) {
                    failed |= ints_push(&found, 3, a, dup_tok[d], m, 0) < 0;
                }
            }
            if (max_edges >= 0 && found.size / 3 > max_edges) {
                over_edges = 1;
                break;
            }
            if (!suffix_branches(&s, u)) {
                continue;
            }
            /* the work: the edges into a tried from here (the reference's frontier entries) */
            work += climb->in_offsets[a + 1] - climb->in_offsets[a];
            if (max_work >= 0 && work > max_work) {
                over_work = 1;
                break;
            }
            for (int64_t e = climb->in_offsets[a]; !failed && e < climb->in_offsets[a + 1]; e++) {
                int32_t next = suffix_child(&s, u, climb->label[e]);
                if (next != s.sentinel) {
                    failed |= ints_push(&stack, 2, climb->source[e], next, 0, 0) < 0;
                }
            }
        }
    }
    for (int64_t i = 0; !failed && i < found.size / 3; i++) {
        token_out_of_range |= found.data[3 * i + 1] < 0 || found.data[3 * i + 1] >= vocab_size;
    }
    free(stack.data), free(by_byte.label), free(by_class.label), free(class_offsets), free(class_source), free(depth);
    free(s.child.keys), free(s.child.values), free(s.branches), free(s.group_offsets);
    Py_END_ALLOW_THREADS
    if (failed || over_edges || over_work || token_out_of_range) {
        free(found.data), free(s.group_tokens);
        if (failed) {
            PyErr_NoMemory();
        } else if (token_out_of_range) {
            PyErr_SetString(PyExc_ValueError, "match_dag: a token of the index is not below vocab_size");
        } else {
            result = PyUnicode_FromString(over_edges ? "edges" : "work");
        }
        goto done;
    }
    free(s.group_tokens);
    int64_t total = found.size / 3 + (int64_t)k * n_eos;
    if (total >= INT32_MAX) {
        free(found.data);
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 edges");
        goto done;
    }
    /* the distinct text tokens, from a bitmap of them */
    uint64_t *used = (uint64_t *)calloc((size_t)(vocab_size + 63) / 64, sizeof(uint64_t));
    int64_t spelled = 0;
    for (int64_t i = 0; used != NULL && i < found.size / 3; i++) {
        int32_t token = found.data[3 * i + 1];
        spelled += !(used[token / 64] >> (token % 64) & 1);
        used[token / 64] |= 1ULL << (token % 64);
    }
    char *offsets_data = NULL, *tokens_data = NULL, *dests_data = NULL, *spelled_data = NULL;
    offsets_out = used ? new_bytes((n + 2) * 4, &offsets_data) : PyErr_NoMemory();
    tokens_out = offsets_out ? new_bytes(total * 4, &tokens_data) : NULL;
    dests_out = tokens_out ? new_bytes(total * 4, &dests_data) : NULL;
    spelled_out = dests_out ? new_bytes(spelled * 4, &spelled_data) : NULL;
    if (spelled_out == NULL) {
        free(found.data), free(used);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    int32_t *spelled_ids = (int32_t *)spelled_data;
    for (int64_t w = 0, at = 0; w < (vocab_size + 63) / 64; w++) {
        for (uint64_t bits = used[w]; bits; bits &= bits - 1) {
            spelled_ids[at++] = (int32_t)(w * 64 + __builtin_ctzll(bits));
        }
    }
    free(used);
    failed = dag_csr(&found, (int32_t)n, accepting, k, eos_ids, n_eos, vocab_size, (int32_t *)offsets_data,
                     (int32_t *)tokens_data, (int32_t *)dests_data) < 0;
    free(found.data);
    Py_END_ALLOW_THREADS
    result = failed ? PyErr_NoMemory() : PyTuple_Pack(4, offsets_out, tokens_out, dests_out, spelled_out);
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(views[i]);
    }
    Py_XDECREF(offsets_out);
    Py_XDECREF(tokens_out);
    Py_XDECREF(dests_out);
    Py_XDECREF(spelled_out);
    return result;
}
