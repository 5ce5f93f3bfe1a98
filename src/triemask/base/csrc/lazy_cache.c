/* ------------------------------------------------------------------ lazy layout: the cache */

static inline int32_t lazy_first_child(const Lazy *z, int32_t v) {
    int32_t f = z->child_blocks[v >> 6];
    for (int32_t a = v & ~63; a < v; a++) {
        f += z->node_word[a] & LAZY_COUNT;
    }
    return f;
}

/* The sorted index of the value ending at terminal node v: its rank among terminal nodes. */
static inline int32_t lazy_value_index(const Lazy *z, int32_t v) {
    int32_t rank = z->terminal_blocks[v >> 6];
    for (int32_t a = v & ~63; a < v; a++) {
        rank += (z->node_word[a] & LAZY_TERMINAL) != 0;
    }
    return z->terminal_values[rank];
}

static inline size_t bucket_of(const Lazy *z, int32_t node) {
    return (size_t)(((uint64_t)(uint32_t)node * 0x9E3779B97F4A7C15ULL) >> (64 - z->bucket_bits));
}

static void lazy_unlink(Lazy *z, Entry *e) {
    if (e->newer) {
        e->newer->older = e->older;
    } else {
        z->newest = e->older;
    }
    if (e->older) {
        e->older->newer = e->newer;
    } else {
        z->oldest = e->newer;
    }
}

static void lazy_push_front(Lazy *z, Entry *e) {
    e->newer = NULL;
    e->older = z->newest;
    if (z->newest) {
        z->newest->newer = e;
    } else {
        z->oldest = e;
    }
    z->newest = e;
}

static void lazy_evict_oldest(Lazy *z) {
    Entry *e = z->oldest;
    lazy_unlink(z, e);
    Entry **link = &z->buckets[bucket_of(z, e->node)];
    while (*link != e) {
        link = &(*link)->chain;
    }
    *link = e->chain;
    z->entries--;
    z->bytes -= e->bytes;
    z->evictions++;
    free(e);
}

/* Keep `e` if it fits the bound (evicting the least recently used), else hold it for this
 * call only (freed at the next miss). Doubles the buckets when they run full and fit. */
static void lazy_insert(Lazy *z, Entry *e) {
    size_t bucket_bytes = ((size_t)1 << z->bucket_bits) * sizeof(Entry *);
    if (e->bytes + bucket_bytes > z->limit) {
        z->transient = e;
        return;
    }
    while (z->oldest != NULL && z->bytes + e->bytes > z->limit) {
        lazy_evict_oldest(z);
    }
    if (z->entries >= ((size_t)1 << z->bucket_bits) && z->bytes + e->bytes + bucket_bytes <= z->limit) {
        Entry **grown = (Entry **)calloc((size_t)2 << z->bucket_bits, sizeof(Entry *));
        if (grown != NULL) { /* else: longer chains, still correct */
            Entry **old = z->buckets;
            size_t old_size = (size_t)1 << z->bucket_bits;
            z->buckets = grown;
            z->bucket_bits++;
            z->bytes += bucket_bytes;
            for (size_t b = 0; b < old_size; b++) {
                for (Entry *c = old[b]; c != NULL;) {
                    Entry *next = c->chain;
                    size_t slot = bucket_of(z, c->node);
                    c->chain = z->buckets[slot];
                    z->buckets[slot] = c;
                    c = next;
                }
            }
            free(old);
            while (z->oldest != NULL && z->bytes + e->bytes > z->limit) {
                lazy_evict_oldest(z);
            }
        }
    }
    size_t slot = bucket_of(z, e->node);
    e->chain = z->buckets[slot];
    z->buckets[slot] = e;
    lazy_push_front(z, e);
    z->entries++;
    z->bytes += e->bytes;
}

static int grow(void **buffer, size_t *capacity, size_t needed, size_t item) {
    if (needed <= *capacity) {
        return 0;
    }
    size_t size = *capacity ? 2 * *capacity : 256;
    while (size < needed) {
        size *= 2;
    }
    void *grown = realloc(*buffer, size * item);
    if (grown == NULL) {
        return -1;
    }
    *buffer = grown;
    *capacity = size;
    return 0;
}

static inline int bits_has(const uint64_t *bits, uint8_t byte) {
    return (int)(bits[byte / 64] >> (byte % 64) & 1);
}

/* The slot of DAG node v's edge on `byte` (which it has): its rank among v's bytes. */
static inline int32_t dag_slot(const Lazy *z, int32_t v, uint8_t byte) {
    uint64_t below = z->dag_bits[4 * (int64_t)v + byte / 64] & (((uint64_t)1 << (byte % 64)) - 1);
    return z->dag_rank[4 * (int64_t)v + byte / 64] + popcount64(below);
}

/* A DAG node's child on `byte`, or -1. */
static inline int32_t dag_child(const Lazy *z, int32_t v, uint8_t byte) {
    if (z->dag_small != NULL) {
        uint8_t to = z->dag_small[256 * v + byte];
        return to == DAG_NONE ? -1 : to;
    }
    return bits_has(z->dag_bits + 4 * (int64_t)v, byte) ? z->slot_dest[dag_slot(z, v, byte)] : -1;
}

/* The keys of the tokens ending at (breadth-first) token-trie node u, as edges to `dest`, at
 * nk on (several when ids share their bytes); how many, or -1 for no memory. */
static inline int64_t lazy_emit(Lazy *z, size_t nk, int32_t u, int32_t dest) {
    const int32_t lo = z->tok->token_offsets[u], hi = z->tok->token_offsets[u + 1];
    if (grow((void **)&z->tok->keys, &z->tok->keys_cap, nk + (size_t)(hi - lo) + 1, sizeof(uint64_t)) < 0) {
        return -1;
    }
    for (int32_t i = lo; i < hi; i++) {
        z->tok->keys[nk + (size_t)(i - lo)] = (uint64_t)(uint32_t)z->tok->token_ids[i] << 32 | (uint32_t)dest;
    }
    return hi - lo;
}

/* The tokens below (breadth-first) token-trie node u, a DAG's node v reached at u, where every
 * byte below u leads down v's run (Lazy.run_mask): each token to the run's node at its depth
 * below u, read forward in preorder. How many keys now, or -1 for no memory. */
static int64_t lazy_emit_run(Lazy *z, size_t nk, int32_t u, int32_t v) {
    const TokenTrieTables *tok = z->tok;
    const int32_t *offsets = tok->offsets, *ids = tok->ids;
    const uint32_t *byte_depth = tok->byte_depth;
    const int16_t *run = z->run_to + v * (RUN_MAX + 1);
    int32_t k = tok->pre[u], end = tok->skip[k];
    uint32_t depth = byte_depth[k] >> 8;
    if (grow((void **)&z->tok->keys, &z->tok->keys_cap, nk + (size_t)(offsets[end] - offsets[k + 1]) + 1,
             sizeof(uint64_t)) < 0) {
        return -1;
    }
    uint64_t *keys = z->tok->keys;
    for (int32_t j = k + 1; j < end; j++) { /* (the first id written always: ids has one spare) */
        int32_t to = run[(byte_depth[j] >> 8) - depth], lo = offsets[j], hi = offsets[j + 1];
        keys[nk] = (uint64_t)(uint32_t)ids[lo] << 32 | (uint32_t)to;
        nk += (size_t)(hi > lo && to >= 0);
        for (int32_t i = lo + 1; i < hi && to >= 0; i++) {
            keys[nk++] = (uint64_t)(uint32_t)ids[i] << 32 | (uint32_t)to;
        }
    }
    return (int64_t)nk;
}

/* The tokens below (breadth-first) token-trie node u, a DAG's node v reached at u, where v's
 * run is wide and closed for as deep as u's subtree goes (Lazy.run_closed): read forward in
 * preorder, a node whose byte is in the run's groups at its depth is matched (each token to
 * the run's node there), any other ends the match, its subtree skipped. The subtree's bytes
 * need not all follow the run (as lazy_emit_run's do): an identifier's first row, below
 * "a" the tokens "a.b" or "a-" too. How many keys now, or -1 for no memory. */
static int64_t lazy_scan_run(Lazy *z, size_t nk, int32_t u, int32_t v) {
    const TokenTrieTables *tok = z->tok;
    const int32_t *offsets = tok->offsets, *ids = tok->ids, *skip = tok->skip;
    const uint32_t *byte_depth = tok->byte_depth;
    const uint8_t *nodes = z->run_node + v * (RUN_MAX + 1);
    const int16_t *run = z->run_to + v * (RUN_MAX + 1);
    int32_t k = tok->pre[u], end = skip[k];
    uint32_t depth = byte_depth[k] >> 8;
    if (grow((void **)&z->tok->keys, &z->tok->keys_cap, nk + (size_t)(offsets[end] - offsets[k + 1]) + 1,
             sizeof(uint64_t)) < 0) {
        return -1;
    }
    uint64_t *keys = z->tok->keys;
    for (int32_t j = k + 1; j < end;) {
        uint32_t m = (byte_depth[j] >> 8) - depth, from = nodes[m - 1];
        if (from == DAG_NONE || !(z->run_step[from] >> BYTE_GROUP[byte_depth[j] & 0xFF] & 1)) {
            j = skip[j];
            continue;
        }
        int32_t to = run[m], lo = offsets[j], hi = offsets[j + 1];
        keys[nk] = (uint64_t)(uint32_t)ids[lo] << 32 | (uint32_t)to; /* (as in lazy_emit_run) */
        nk += (size_t)(hi > lo && to >= 0);
        for (int32_t i = lo + 1; i < hi && to >= 0; i++) {
            keys[nk++] = (uint64_t)(uint32_t)ids[i] << 32 | (uint32_t)to;
        }
        j++;
    }
    return (int64_t)nk;
}

/* A node's edges from scratch: depth-first over (value-trie node v, token-trie node u) pairs
 * spelling the same bytes below `node`; each token ending at u is an edge node -> v. The token
 * trie's children of u are contiguous and in byte order (TokenTrieTables), so a trie's children
 * are merged with them, and a DAG's (a pattern's automaton) found by byte, in one table or bit
 * lookup. Along a small DAG's runs, u's subtree is read forward in preorder instead, with no
 * lookup per node: matched whole where every byte below u follows the run (lazy_emit_run), or
 * scanned where the run is wide and closed (lazy_scan_run). An identifier's first row on
 * Qwen2.5: 68,000 token-trie nodes, 1.4 -> 0.17 ms. The count of keys, or -1 for no memory. */
static NOINLINE int64_t lazy_walk(Lazy *z, int32_t node) {
    const TokenTrieTables *tok = z->tok;
    const int32_t *children = tok->children;
    const uint8_t *tok_byte = tok->node_byte;
    const uint64_t *run_mask = z->run_mask;
    const int dag = z->dag_bits != NULL;
    size_t nk = 0, sp = 1;
    if (grow((void **)&z->tok->stack, &z->tok->stack_cap, 2, sizeof(int32_t)) < 0) {
        return -1;
    }
    z->tok->stack[0] = node;
    z->tok->stack[1] = 0;
    while (sp > 0) {
        sp--;
        int32_t v = z->tok->stack[2 * sp], u = z->tok->stack[2 * sp + 1];
        uint16_t word = z->node_word[v];
        if (u != 0 && !(word & LAZY_DEAD)) {
            int64_t written = lazy_emit(z, nk, u, v);
            if (written < 0) {
                return -1;
            }
            nk += (size_t)written;
        }
        int32_t count = word & LAZY_COUNT;
        int32_t j = children[u], end = children[u + 1];
        if (count == 0 || j == end) {
            continue;
        }
        if (run_mask != NULL && tok->height[u] <= RUN_MAX) {
            int whole = (tok->below[u] & ~run_mask[v * (RUN_MAX + 1) + tok->height[u]]) == 0;
            int scan = !whole && z->run_closed[v] & RUN_WIDE && (z->run_closed[v] & ~RUN_WIDE) >= tok->height[u];
            int64_t now = whole ? lazy_emit_run(z, nk, u, v) : scan ? lazy_scan_run(z, nk, u, v) : (int64_t)nk;
            if (now < 0) {
                return -1;
            }
            if (whole || scan) {
                nk = (size_t)now;
                continue;
            }
        }
        if (grow((void **)&z->tok->stack, &z->tok->stack_cap, 2 * (sp + (size_t)count + 1), sizeof(int32_t)) < 0) {
            return -1;
        }
        int32_t *stack = z->tok->stack;
        if (dag) { /* each token-trie child's byte looked up in v's (a pair written always, kept on a match) */
            for (; j < end; j++) {
                int32_t child = dag_child(z, v, tok_byte[j]);
                stack[2 * sp] = child;
                stack[2 * sp + 1] = j;
                sp += child >= 0;
            }
            continue;
        }
        int32_t first = lazy_first_child(z, v);
        for (int32_t i = 0; i < count && j < end;) { /* both child lists are in byte order */
            uint8_t bv = z->node_byte[first + i], bu = tok_byte[j];
            if (bv < bu) {
                i++;
            } else if (bv > bu) {
                j++;
            } else {
                stack[2 * sp] = first + i++;
                stack[2 * sp + 1] = j++;
                sp++;
            }
        }
    }
    return (int64_t)nk;
}

static inline int popcount32(uint32_t word) {
    return popcount64(word);
}

/* A trie's wide node's row, and its edges in token order without sorting them: each token's
 * place is the number of bits before its own in the row (a count per word, then a popcount), as
 * fast as writing them (33,000 tokens: 0.13 ms sorted). -1 when the keys hold a token twice (a
 * token-trie id listed twice: never from a Vocabulary, whose EOS ids have no text, but the
 * arrays are checked, not trusted) or no memory: then sort them. */
static int lazy_place_by_row(const Kernel *self, Entry *e, const uint64_t *keys) {
    Py_ssize_t width = self->width;
    int32_t *before = (int32_t *)malloc((size_t)width * sizeof(int32_t));
    if (before == NULL) {
        return -1;
    }
    memset(e->row, 0, (size_t)width * 4);
    for (int32_t i = 0; i < e->count; i++) {
        uint32_t token = (uint32_t)(keys[i] >> 32);
        e->row[token >> 5] |= 1u << (token & 31);
    }
    int32_t total = 0;
    for (Py_ssize_t w = 0; w < width; w++) {
        before[w] = total;
        total += popcount32(e->row[w]);
    }
    if (total != e->count) {
        free(before);
        return -1;
    }
    for (int32_t i = 0; i < e->count; i++) {
        uint32_t token = (uint32_t)(keys[i] >> 32);
        int32_t at = before[token >> 5] + popcount32(e->row[token >> 5] & ((1u << (token & 31)) - 1));
        e->data[at] = (int32_t)token;
        e->data[e->count + at] = (int32_t)(keys[i] & 0xFFFFFFFFu);
    }
    free(before);
    return 0;
}

static Entry *lazy_compute(const Kernel *self, int32_t node) {
    Lazy *z = self->lazy;
    size_t nk = 0;
    if (z->node_word[node] & LAZY_COUNT) {
        int64_t walked = lazy_walk(z, node);
        if (walked < 0) {
            return NULL;
        }
        nk = (size_t)walked;
    }
    if ((z->node_word[node] & LAZY_TERMINAL) && z->n_eos > 0) {
        if (grow((void **)&z->tok->keys, &z->tok->keys_cap, nk + (size_t)z->n_eos, sizeof(uint64_t)) < 0) {
            return NULL;
        }
        uint32_t final = (uint32_t)(self->num_nodes + lazy_value_index(z, node));
        for (Py_ssize_t i = 0; i < z->n_eos; i++) {
            z->tok->keys[nk++] = (uint64_t)(uint32_t)z->eos[i] << 32 | final;
        }
    }
    int whole = (int64_t)nk >= self->dense_min;
    /* A DAG's wide node keeps its row alone: a step reads the token's bytes down the DAG (see
     * row_edge_to), and the row is 4% of the tokens and dests it stands for (an identifier's
     * 33 rows held 11 MiB, more than the default cache) and made without placing them */
    int listed = !(whole && z->dag_bits != NULL);
    size_t bytes = sizeof(Entry) + (listed ? nk * 2 * sizeof(int32_t) : 0) + (whole ? (size_t)self->width * 4 : 0);
    Entry *e = (Entry *)malloc(bytes);
    if (e == NULL) {
        return NULL;
    }
    e->bytes = bytes;
    e->node = node;
    e->count = (int32_t)nk;
    e->listed = listed;
    e->row = whole ? (uint32_t *)(e->data + (listed ? 2 * nk : 0)) : NULL;
    if (!listed) {
        memset(e->row, 0, (size_t)self->width * 4);
        for (size_t i = 0; i < nk; i++) {
            uint32_t token = (uint32_t)(z->tok->keys[i] >> 32);
            e->row[token >> 5] |= 1u << (token & 31);
        }
        e->count = 0; /* the tokens, once each (see lazy_place_by_row) */
        for (Py_ssize_t w = 0; w < self->width; w++) {
            e->count += popcount32(e->row[w]);
        }
    } else if (!whole || lazy_place_by_row(self, e, z->tok->keys) < 0) {
        sort_token_keys(z->tok->keys, (int64_t)nk);
        for (size_t i = 0; i < nk; i++) {
            e->data[i] = (int32_t)(z->tok->keys[i] >> 32);
            e->data[nk + i] = (int32_t)(z->tok->keys[i] & 0xFFFFFFFFu);
        }
    }
    if (z->tok->keys_cap > (1u << 16)) { /* the scratch of an unusually wide node: not kept */
        free(z->tok->keys);
        z->tok->keys = NULL;
        z->tok->keys_cap = 0;
    }
    if (z->tok->stack_cap > (1u << 16)) {
        free(z->tok->stack);
        z->tok->stack = NULL;
        z->tok->stack_cap = 0;
    }
    return e;
}

