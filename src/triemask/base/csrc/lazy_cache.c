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

/* A node's edges from scratch: the token trie in preorder (TokenTrieTables), each token-trie
 * node k matched against the value-trie node its parent reached (a frame per depth: the end of
 * the parent's subtree, its node v, and for a trie the cursor in v's children, both lists being
 * in byte order); an unmatched k's subtree is skipped in one jump, and the rest of a parent's
 * once its children are used up. Each token ending at k is an edge node -> the node k reached.
 * (A DAG's nodes the same: its slots lead to shared nodes, a child found by its byte's bit.) */
static Entry *lazy_compute(const Kernel *self, int32_t node) {
    Lazy *z = self->lazy;
    /* (locals: the compiler cannot tell that the frames and keys written leave these alone) */
    const uint8_t *tok_byte = z->tok->byte, *node_byte = z->node_byte, *small = z->dag_small;
    const int32_t *tok_skip = z->tok->skip, *tok_offsets = z->tok->offsets, *tok_ids = z->tok->ids;
    const uint16_t *node_word = z->node_word;
    const int dag = z->dag_bits != NULL;
    const int32_t nodes = z->tok->nodes;
    size_t nk = 0;
    int32_t count = node_word[node] & LAZY_COUNT;
    if (count > 0) {
        if (grow((void **)&z->stack, &z->stack_cap, 4 * ((size_t)z->tok->depth + 1), sizeof(int32_t)) < 0) {
            return NULL;
        }
        int32_t *f = z->stack; /* the innermost frame: subtree end, v, next child slot, v's slot end */
        f[0] = nodes;
        f[1] = node;
        f[2] = dag ? 0 : lazy_first_child(z, node);
        f[3] = f[2] + count;
        for (int32_t k = 1; k < nodes;) {
            while (k >= f[0]) {
                f -= 4;
            }
            uint8_t byte = tok_byte[k];
            int32_t next = tok_skip[k], child = -1;
            if (small != NULL) {
                uint8_t to = small[256 * f[1] + byte];
                child = to == DAG_NONE ? -1 : to;
            } else if (dag) {
                child = bits_has(z->dag_bits + 4 * (int64_t)f[1], byte) ? z->slot_dest[dag_slot(z, f[1], byte)] : -1;
            } else {
                int32_t at = f[2];
                while (at < f[3] && node_byte[at] < byte) {
                    at++;
                }
                if (at == f[3]) { /* v's children used up: the rest of the parent's subtree too */
                    k = f[0];
                    continue;
                }
                child = node_byte[at] == byte ? at++ : -1;
                f[2] = at;
            }
            if (child < 0) {
                k = next;
                continue;
            }
            uint16_t word = node_word[child];
            int32_t lo = tok_offsets[k], hi = tok_offsets[k + 1];
            if (hi > lo && !(word & LAZY_DEAD)) {
                if (grow((void **)&z->keys, &z->keys_cap, nk + (size_t)(hi - lo), sizeof(uint64_t)) < 0) {
                    return NULL;
                }
                for (int32_t i = lo; i < hi; i++) {
                    z->keys[nk++] = (uint64_t)(uint32_t)tok_ids[i] << 32 | (uint32_t)child;
                }
            }
            int32_t below = word & LAZY_COUNT;
            if (below > 0 && next > k + 1) { /* descend: k's children against child's */
                f += 4;
                f[0] = next;
                f[1] = child;
                f[2] = dag ? 0 : lazy_first_child(z, child);
                f[3] = f[2] + below;
            }
            k = below > 0 ? k + 1 : next;
        }
    }
    if ((z->node_word[node] & LAZY_TERMINAL) && z->n_eos > 0) {
        if (grow((void **)&z->keys, &z->keys_cap, nk + (size_t)z->n_eos, sizeof(uint64_t)) < 0) {
            return NULL;
        }
        uint32_t final = (uint32_t)(self->num_nodes + lazy_value_index(z, node));
        for (Py_ssize_t i = 0; i < z->n_eos; i++) {
            z->keys[nk++] = (uint64_t)(uint32_t)z->eos[i] << 32 | final;
        }
    }
    sort_token_keys(z->keys, (int64_t)nk);
    int whole = (int64_t)nk >= self->dense_min;
    size_t bytes = sizeof(Entry) + nk * 2 * sizeof(int32_t) + (whole ? (size_t)self->width * 4 : 0);
    Entry *e = (Entry *)malloc(bytes);
    if (e == NULL) {
        return NULL;
    }
    e->bytes = bytes;
    e->node = node;
    e->count = (int32_t)nk;
    e->row = whole ? (uint32_t *)(e->data + 2 * nk) : NULL;
    for (size_t i = 0; i < nk; i++) {
        e->data[i] = (int32_t)(z->keys[i] >> 32);
        e->data[nk + i] = (int32_t)(z->keys[i] & 0xFFFFFFFFu);
    }
    if (whole) {
        memset(e->row, 0, (size_t)self->width * 4);
        for (size_t i = 0; i < nk; i++) {
            e->row[(uint32_t)e->data[i] >> 5] |= 1u << ((uint32_t)e->data[i] & 31);
        }
    }
    if (z->keys_cap > (1u << 16)) { /* the scratch of an unusually wide node: not kept */
        free(z->keys);
        z->keys = NULL;
        z->keys_cap = 0;
    }
    if (z->stack_cap > (1u << 16)) {
        free(z->stack);
        z->stack = NULL;
        z->stack_cap = 0;
    }
    return e;
}

