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

/* A node's edges from scratch: depth-first over (value-trie node v, token-trie node u) pairs
 * spelling the same bytes below `node`; each token ending at u is an edge node -> v. (A DAG's
 * nodes the same: its slots lead to shared nodes, and the walk is bounded by the token trie.) */
static Entry *lazy_compute(const Kernel *self, int32_t node) {
    Lazy *z = self->lazy;
    size_t nk = 0, sp = 1;
    if (grow((void **)&z->stack, &z->stack_cap, 2, sizeof(int32_t)) < 0) {
        return NULL;
    }
    z->stack[0] = node;
    z->stack[1] = 0;
    while (sp > 0) {
        sp--;
        int32_t v = z->stack[2 * sp], u = z->stack[2 * sp + 1];
        uint16_t word = z->node_word[v];
        if (u != 0 && !(word & LAZY_DEAD)) {
            int32_t lo = z->tok_offsets[u], hi = z->tok_offsets[u + 1];
            if (grow((void **)&z->keys, &z->keys_cap, nk + (size_t)(hi - lo), sizeof(uint64_t)) < 0) {
                return NULL;
            }
            for (int32_t i = lo; i < hi; i++) {
                z->keys[nk++] = (uint64_t)(uint32_t)z->tok_ids[i] << 32 | (uint32_t)v;
            }
        }
        int32_t count = word & LAZY_COUNT;
        int32_t j = z->tok_children[u], end = z->tok_children[u + 1];
        if (count == 0 || j == end) {
            continue;
        }
        if (grow((void **)&z->stack, &z->stack_cap, 2 * (sp + (size_t)count), sizeof(int32_t)) < 0) {
            return NULL;
        }
        if (z->dag_bits != NULL) { /* a DAG: each token-trie child's byte looked up in v's bits */
            const uint64_t *bits = z->dag_bits + 4 * (int64_t)v;
            const int32_t *rank = z->dag_rank + 4 * (int64_t)v;
            for (; j < end; j++) {
                uint8_t byte = z->tok_byte[j];
                uint64_t below = bits[byte / 64] & (((uint64_t)1 << (byte % 64)) - 1);
                if (bits[byte / 64] >> (byte % 64) & 1) {
                    z->stack[2 * sp] = z->slot_dest[rank[byte / 64] + popcount64(below)];
                    z->stack[2 * sp + 1] = j;
                    sp++;
                }
            }
            continue;
        }
        int32_t first = lazy_first_child(z, v);
        for (int32_t i = 0; i < count && j < end;) { /* both child lists are in byte order */
            uint8_t bv = z->node_byte[first + i], bu = z->tok_byte[j];
            if (bv < bu) {
                i++;
            } else if (bv > bu) {
                j++;
            } else {
                z->stack[2 * sp] = first + i++;
                z->stack[2 * sp + 1] = j++;
                sp++;
            }
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

