/* ------------------------------------------------------------------ minimal DAGs: patterns and tries */

/* Two builders share the last step (signatures_to_dag): pattern_dag from a regex's syntax tree,
 * dag_of_trie from a set's trie (at the end of the file). */

/* pattern_dag(program int32, max_nfa_states, max_dfa_states, max_work)
 *   -> (in_offsets i64[n + 1], source i32, byte u8, dest i32, accepting i32, level_offsets i64) as
 *      bytearrays (a ByteDag's arrays), None when the language is empty, or "nfa" / "dfa" / "work"
 *      when the automaton passes a limit (see triemask.sets.regex, whose Python is the reference)
 *
 * The program is the syntax tree in prefix order, each node:
 *   0 nseq (len (lo hi)*len)*nseq   byte-range sequences (a character class in UTF-8)
 *   1 n part*n                       concatenation
 *   2 n option*n                     alternation
 *   3 low high body                  bounded repetition
 * Pipeline: Thompson NFA with epsilon moves (states 0 start, 1 end) -> subset construction over
 * byte intervals, with the reference's work measure -> Revuz minimisation (post-order signatures:
 * acceptance and the row of merged targets) -> levels by longest distance from the start, nodes
 * numbered level by level and within a level by the smallest (source number, byte) of an edge in. */

enum { PROGRAM_CHARS, PROGRAM_CONCAT, PROGRAM_ALT, PROGRAM_REPEAT };

typedef struct {
    const int32_t *program;
    Py_ssize_t length;
    int32_t states, max_states;
    Int32s eps, moves; /* (from, to) and (from, lo, hi, to) */
    const char *error;  /* "nfa", or "program" for a malformed program; NULL */
    int no_memory;
} Nfa;

/* The position after the node at `pos`, or -1 for a malformed program. */
static Py_ssize_t program_skip(const Nfa *a, Py_ssize_t pos, int depth) {
    const int32_t *p = a->program;
    if (depth > 2000 || pos + 1 >= a->length || p[pos + 1] < 0) {
        return -1;
    }
    if (p[pos] == PROGRAM_CHARS) {
        Py_ssize_t at = pos + 2;
        for (int32_t i = 0; i < p[pos + 1]; i++) {
            if (at >= a->length || p[at] < 1 || p[at] > 4) {
                return -1;
            }
            at += 1 + 2 * (Py_ssize_t)p[at];
        }
        return at <= a->length ? at : -1;
    }
    if (p[pos] == PROGRAM_CONCAT || p[pos] == PROGRAM_ALT) {
        Py_ssize_t at = pos + 2;
        for (int32_t i = 0; i < p[pos + 1] && at >= 0; i++) {
            at = program_skip(a, at, depth + 1);
        }
        return at;
    }
    if (p[pos] == PROGRAM_REPEAT && pos + 2 < a->length && p[pos + 2] >= p[pos + 1]) {
        return program_skip(a, pos + 3, depth + 1);
    }
    return -1;
}

static int32_t nfa_state(Nfa *a) {
    if (a->states >= a->max_states) {
        a->error = "nfa";
        return -1;
    }
    return a->states++;
}

static int nfa_eps(Nfa *a, int32_t from, int32_t to) {
    if (ints_push(&a->eps, 2, from, to, 0, 0) < 0) {
        a->no_memory = 1;
        return -1;
    }
    return 0;
}

/* Adds the node at `pos` of a program program_skip has checked as a path start -> end; the
 * position after it, or -1 (a->error or no memory). (Checked once, not per node: a check per
 * node read a repeated body's subtree again for every copy and every level above it.) */
static Py_ssize_t nfa_build(Nfa *a, Py_ssize_t pos, int32_t start, int32_t end, int depth) {
    const int32_t *p = a->program;
    Py_ssize_t after = pos + 2;
    int32_t count = p[pos + 1];
    if (p[pos] == PROGRAM_CHARS) {
        Py_ssize_t at = pos + 2;
        for (int32_t i = 0; i < count; i++) {
            int32_t length = p[at], from = start;
            for (int32_t j = 0; j < length; j++) {
                int32_t lo = p[at + 1 + 2 * j], hi = p[at + 2 + 2 * j];
                int32_t following = j == length - 1 ? end : nfa_state(a);
                if (lo < 0 || hi > 255 || lo > hi) {
                    a->error = "program";
                }
                if (following < 0 || a->error != NULL) {
                    return -1;
                }
                if (ints_push(&a->moves, 4, from, lo, hi, following) < 0) {
                    a->no_memory = 1;
                    return -1;
                }
                from = following;
            }
            at += 1 + 2 * (Py_ssize_t)length;
        }
        after = at;
    } else if (p[pos] == PROGRAM_CONCAT) {
        Py_ssize_t at = pos + 2;
        int32_t from = start;
        for (int32_t i = 0; i < count; i++) {
            int32_t following = i == count - 1 ? end : nfa_state(a);
            if (following < 0 || (at = nfa_build(a, at, from, following, depth + 1)) < 0) {
                return -1;
            }
            from = following;
        }
        if (count == 0 && nfa_eps(a, start, end) < 0) {
            return -1;
        }
        after = at;
    } else if (p[pos] == PROGRAM_ALT) {
        Py_ssize_t at = pos + 2;
        for (int32_t i = 0; i < count; i++) {
            if ((at = nfa_build(a, at, start, end, depth + 1)) < 0) {
                return -1;
            }
        }
        after = at;
    } else { /* repetition: high copies of the body, the optional ones skippable */
        int32_t low = count, high = p[pos + 2], from = start;
        after = high == 0 ? program_skip(a, pos + 3, depth + 1) : -1;
        for (int32_t i = 0; i < high; i++) {
            int32_t following = i == high - 1 ? end : nfa_state(a);
            if (following < 0 || (after = nfa_build(a, pos + 3, from, following, depth + 1)) < 0) {
                return -1;
            }
            if (i >= low && nfa_eps(a, from, end) < 0) {
                return -1;
            }
            from = following;
        }
        if (high == 0 && nfa_eps(a, start, end) < 0) {
            return -1;
        }
    }
    return after;
}

/* Sets of ints (sorted), interned: ids by content. */
typedef struct {
    Int32s pool;      /* contents, concatenated */
    int64_t *offsets; /* id -> start in pool; offsets[count] the end */
    uint64_t *hashes;
    int32_t *slots; /* open addressing over ids, -1 empty */
    uint64_t mask;
    int32_t count, capacity;
} Interned;

static uint64_t ints_hash(const int32_t *data, int64_t size) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)size;
    for (int64_t i = 0; i < size; i++) {
        h = (h ^ (uint32_t)data[i]) * 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 31;
    }
    return h;
}

static int interned_init(Interned *t) {
    memset(t, 0, sizeof(*t));
    t->capacity = 64;
    t->offsets = (int64_t *)malloc(((size_t)t->capacity + 1) * sizeof(int64_t));
    t->hashes = (uint64_t *)malloc((size_t)t->capacity * sizeof(uint64_t));
    t->slots = (int32_t *)malloc(128 * sizeof(int32_t));
    if (t->offsets == NULL || t->hashes == NULL || t->slots == NULL) {
        return -1;
    }
    memset(t->slots, 0xFF, 128 * sizeof(int32_t));
    t->mask = 127;
    t->offsets[0] = 0;
    return 0;
}

static void interned_free(Interned *t) {
    free(t->pool.data), free(t->offsets), free(t->hashes), free(t->slots);
}

/* The id of `data[0 .. size]`, added when new (*added); -1 for no memory. */
static int32_t intern(Interned *t, const int32_t *data, int64_t size, int *added) {
    uint64_t h = ints_hash(data, size), slot = h & t->mask;
    for (; t->slots[slot] >= 0; slot = (slot + 1) & t->mask) {
        int32_t id = t->slots[slot];
        int64_t at = t->offsets[id];
        if (t->hashes[id] == h && t->offsets[id + 1] - at == size &&
            (size == 0 || memcmp(t->pool.data + at, data, (size_t)size * sizeof(int32_t)) == 0)) {
            *added = 0;
            return id;
        }
    }
    *added = 1;
    if (t->count + 1 >= t->capacity) {
        int32_t capacity = 2 * t->capacity;
        int64_t *offsets = (int64_t *)realloc(t->offsets, ((size_t)capacity + 1) * sizeof(int64_t));
        if (offsets == NULL) {
            return -1;
        }
        t->offsets = offsets;
        uint64_t *hashes = (uint64_t *)realloc(t->hashes, (size_t)capacity * sizeof(uint64_t));
        if (hashes == NULL) {
            return -1;
        }
        t->hashes = hashes, t->capacity = capacity;
    }
    if (ints_concat(&t->pool, data, size) < 0) {
        return -1;
    }
    int32_t id = t->count++;
    t->hashes[id] = h, t->offsets[id + 1] = t->pool.size;
    t->slots[slot] = id;
    if (2 * (uint64_t)t->count > t->mask) { /* rehash at half load */
        uint64_t mask = 2 * t->mask + 1;
        int32_t *slots = (int32_t *)malloc((size_t)(mask + 1) * sizeof(int32_t));
        if (slots == NULL) {
            return -1;
        }
        memset(slots, 0xFF, (size_t)(mask + 1) * sizeof(int32_t));
        for (int32_t i = 0; i < t->count; i++) {
            uint64_t s = t->hashes[i] & mask;
            while (slots[s] >= 0) {
                s = (s + 1) & mask;
            }
            slots[s] = i;
        }
        free(t->slots);
        t->slots = slots, t->mask = mask;
    }
    return id;
}

static int compare_int32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

static int compare_int64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* The epsilon closure of `raw` (distinct states) into `out`, sorted; its size. */
static int64_t nfa_closure(const int64_t *eps_offsets, const int32_t *eps_to, int32_t *stamp, int32_t epoch,
                           const int32_t *raw, int64_t size, int32_t *out) {
    int64_t count = 0;
    for (int64_t i = 0; i < size; i++) {
        stamp[raw[i]] = epoch, out[count++] = raw[i];
    }
    for (int64_t i = 0; i < count; i++) { /* out doubles as the queue */
        for (int64_t e = eps_offsets[out[i]]; e < eps_offsets[out[i] + 1]; e++) {
            if (stamp[eps_to[e]] != epoch) {
                stamp[eps_to[e]] = epoch, out[count++] = eps_to[e];
            }
        }
    }
    if (count > 32) {
        qsort(out, (size_t)count, sizeof(int32_t), compare_int32);
        return count;
    }
    for (int64_t i = 1; i < count; i++) { /* most closures are small: no calls per comparison */
        int32_t state = out[i];
        int64_t j = i;
        for (; j > 0 && out[j - 1] > state; j--) {
            out[j] = out[j - 1];
        }
        out[j] = state;
    }
    return count;
}

/* A CSR (offsets[states + 1], and the entries' positions in `items` by their first field). */
static int64_t *csr_by_first(const Int32s *items, int width, int32_t states, int64_t **order_out) {
    int64_t count = items->size / width;
    int64_t *offsets = (int64_t *)calloc((size_t)states + 2, sizeof(int64_t));
    int64_t *order = (int64_t *)malloc((size_t)(count > 0 ? count : 1) * sizeof(int64_t));
    *order_out = order;
    if (offsets == NULL || order == NULL) {
        free(offsets);
        return NULL;
    }
    for (int64_t i = 0; i < count; i++) {
        offsets[items->data[i * width] + 2]++;
    }
    for (int32_t s = 0; s <= states; s++) {
        offsets[s + 1] += offsets[s];
    }
    for (int64_t i = 0; i < count; i++) {
        order[offsets[items->data[i * width] + 1]++] = i;
    }
    return offsets;
}

typedef struct {
    Int32s rows;       /* (lo, hi, target) triples of every state, by state in rows_at */
    int64_t *rows_at;  /* state -> (start, length) in rows, as triple counts */
    uint8_t *accepting;
    int32_t count, capacity;
} Dfa;

static int dfa_grow(Dfa *d) {
    if (d->count < d->capacity) {
        return 0;
    }
    int32_t capacity = d->capacity ? 2 * d->capacity : 64;
    int64_t *rows_at = (int64_t *)realloc(d->rows_at, (size_t)capacity * 2 * sizeof(int64_t));
    if (rows_at == NULL) {
        return -1;
    }
    d->rows_at = rows_at;
    uint8_t *accepting = (uint8_t *)realloc(d->accepting, (size_t)capacity);
    if (accepting == NULL) {
        return -1;
    }
    d->accepting = accepting, d->capacity = capacity;
    return 0;
}

/* Subset construction: see _determinise. Returns NULL or the limit passed ("dfa", "work"), or
 * "memory". */
static const char *determinise(const Nfa *a, int32_t max_dfa, int64_t max_work, Dfa *d) {
    const char *why = "memory";
    int64_t *eps_order = NULL, *move_order = NULL;
    int64_t *eps_offsets = csr_by_first(&a->eps, 2, a->states, &eps_order);
    int64_t *move_offsets = csr_by_first(&a->moves, 4, a->states, &move_order);
    int32_t *eps_to = (int32_t *)malloc((size_t)(a->eps.size / 2 + 1) * sizeof(int32_t));
    int32_t *stamp = (int32_t *)calloc((size_t)a->states, sizeof(int32_t));
    int32_t *scratch = (int32_t *)malloc(2 * (size_t)a->states * sizeof(int32_t));
    int32_t *gathered = NULL, *pending = NULL;
    Int32s row = {0};
    Interned subsets;
    int ready = interned_init(&subsets) == 0;
    if (eps_offsets == NULL || move_offsets == NULL || eps_to == NULL || stamp == NULL || scratch == NULL ||
        !ready) {
        goto out;
    }
    for (int64_t i = 0; i < a->eps.size / 2; i++) {
        eps_to[i] = a->eps.data[2 * eps_order[i] + 1];
    }
    int64_t moves_total = a->moves.size / 4, work = 0;
    gathered = (int32_t *)malloc((size_t)(moves_total + 1) * sizeof(int32_t)); /* move indices of a subset */
    pending = (int32_t *)malloc((size_t)(max_dfa + 1) * sizeof(int32_t));
    if (gathered == NULL || pending == NULL) {
        goto out;
    }
    int32_t epoch = 1, start_state = 0, added, npending = 0;
    int64_t size = nfa_closure(eps_offsets, eps_to, stamp, epoch++, &start_state, 1, scratch);
    if (intern(&subsets, scratch, size, &added) < 0 || dfa_grow(d) < 0) {
        goto out;
    }
    d->count = 1;
    pending[npending++] = 0;
    while (npending) {
        int32_t current = pending[--npending];
        int64_t at = subsets.offsets[current], members = subsets.offsets[current + 1] - at, gathered_count = 0;
        uint64_t cut[5] = {0}; /* bit b: a move's range starts at byte b, or ends before it */
        d->accepting[current] = 0;
        for (int64_t i = 0; i < members; i++) {
            int32_t state = subsets.pool.data[at + i];
            d->accepting[current] |= state == 1;
            for (int64_t e = move_offsets[state]; e < move_offsets[state + 1]; e++) {
                const int32_t *move = a->moves.data + 4 * move_order[e];
                gathered[gathered_count++] = (int32_t)move_order[e];
                cut[move[1] / 64] |= (uint64_t)1 << (move[1] % 64);
                cut[(move[2] + 1) / 64] |= (uint64_t)1 << ((move[2] + 1) % 64);
            }
        }
        work += members + 2 * gathered_count;
        if (work > max_work) {
            why = "work";
            goto out;
        }
        row.size = 0;
        for (int lo = 0; lo < 256;) {
            int past = 256; /* the next cut after lo, or the end */
            for (int w = (lo + 1) / 64; w < 4; w++) {
                uint64_t bits = cut[w] & (w == (lo + 1) / 64 ? ~(((uint64_t)1 << ((lo + 1) % 64)) - 1) : ~(uint64_t)0);
                if (bits) {
                    past = w * 64 + __builtin_ctzll(bits);
                    break;
                }
            }
            /* the targets of the moves covering lo .. past - 1, distinct */
            int64_t raw = 0;
            int32_t mark = epoch++;
            for (int64_t g = 0; g < gathered_count; g++) {
                const int32_t *move = a->moves.data + 4 * gathered[g];
                if (move[1] <= lo && past - 1 <= move[2] && stamp[move[3]] != mark) {
                    stamp[move[3]] = mark, scratch[a->states + raw++] = move[3];
                }
            }
            if (raw) {
                size = nfa_closure(eps_offsets, eps_to, stamp, epoch++, scratch + a->states, raw, scratch);
                int32_t target = intern(&subsets, scratch, size, &added);
                if (target < 0) {
                    goto out;
                }
                if (added) {
                    if (d->count >= max_dfa) {
                        why = "dfa";
                        goto out;
                    }
                    if (dfa_grow(d) < 0) {
                        goto out;
                    }
                    d->count++;
                    pending[npending++] = target;
                }
                if (row.size && row.data[row.size - 1] == target && row.data[row.size - 2] == lo - 1) {
                    row.data[row.size - 2] = past - 1;
                } else if (ints_push(&row, 3, lo, past - 1, target, 0) < 0) {
                    goto out;
                }
            }
            lo = past;
        }
        d->rows_at[2 * current] = d->rows.size / 3, d->rows_at[2 * current + 1] = row.size / 3;
        if (ints_concat(&d->rows, row.data, row.size) < 0) {
            goto out;
        }
    }
    why = NULL;
out:
    free(eps_order), free(move_order), free(eps_offsets), free(move_offsets), free(eps_to), free(stamp);
    free(scratch), free(gathered), free(pending), free(row.data);
    if (ready) {
        interned_free(&subsets);
    }
    return why;
}

/* Revuz minimisation: per DFA state (children first) its signature, acceptance then the row
 * over merged targets (dead ends dropped), interned; then the DAG of the signatures. The ByteDag's
 * arrays into `out` (six bytearrays), or Py_None for an empty language. Returns 0, -1 for no
 * memory, -2 with the error set. */
static int signatures_to_dag(const Interned *signatures, PyObject **out);

static int minimise(const Dfa *d, PyObject **out) {
    int32_t n = d->count;
    int32_t *canonical = (int32_t *)malloc((size_t)n * sizeof(int32_t));
    int32_t *stack = (int32_t *)malloc(2 * (size_t)n * sizeof(int32_t));
    uint8_t *visited = (uint8_t *)calloc((size_t)n, 1);
    Int32s merged = {0};
    Interned signatures;
    int ready = interned_init(&signatures) == 0, result = -1;
    if (canonical == NULL || stack == NULL || visited == NULL || !ready) {
        goto out;
    }
    /* post-order from the start (every state is reachable from it): children before parents */
    int32_t top = 0;
    stack[top++] = 0, stack[top++] = 0, visited[0] = 1;
    while (top) {
        int32_t node = stack[top - 2], next = stack[top - 1];
        const int32_t *row = d->rows.data + 3 * d->rows_at[2 * node];
        if (next < d->rows_at[2 * node + 1]) {
            stack[top - 1]++;
            int32_t child = row[3 * next + 2];
            if (!visited[child]) {
                visited[child] = 1;
                stack[top++] = child, stack[top++] = 0;
            }
            continue;
        }
        top -= 2;
        /* the signature: acceptance, then the row over merged targets (dead ends dropped) */
        merged.size = 0;
        if (ints_push(&merged, 1, d->accepting[node], 0, 0, 0) < 0) {
            goto out;
        }
        for (int64_t i = 0; i < d->rows_at[2 * node + 1]; i++) {
            int32_t lo = row[3 * i], hi = row[3 * i + 1], target = canonical[row[3 * i + 2]];
            if (target < 0) {
                continue;
            }
            if (merged.size > 1 && merged.data[merged.size - 1] == target && merged.data[merged.size - 2] == lo - 1) {
                merged.data[merged.size - 2] = hi;
            } else if (ints_push(&merged, 3, lo, hi, target, 0) < 0) {
                goto out;
            }
        }
        int added;
        if (merged.size == 1 && !d->accepting[node]) {
            canonical[node] = -1; /* a dead end: nothing is accepted from here */
        } else if ((canonical[node] = intern(&signatures, merged.data, merged.size, &added)) < 0) {
            goto out;
        }
    }
    if (canonical[0] < 0) {
        *out = Py_None;
        Py_INCREF(Py_None);
        result = 0;
    } else {
        result = signatures_to_dag(&signatures, out);
    }
out:
    free(canonical), free(stack), free(visited), free(merged.data);
    if (ready) {
        interned_free(&signatures);
    }
    return result;
}

/* The DAG of interned signatures (acceptance, then (lo, hi, target) triples; every target an
 * earlier signature, the start the last): levels by longest distance from the start, nodes
 * numbered level by level and within a level by the smallest (source number, byte) of an edge
 * in, then the byte edges by destination, source and byte. See minimise for the answer. */
static int signatures_to_dag(const Interned *signatures_in, PyObject **out) {
    const Interned signatures = *signatures_in;
    int result = -1;
    int32_t *depth = NULL, *number = NULL, *order = NULL, *level_count = NULL;
    int64_t *key = NULL, *in_offsets = NULL;
    /* signature ids are a reverse topological order (children first): the start is the last */
    int32_t count = signatures.count, levels = 0;
    depth = (int32_t *)calloc((size_t)count, sizeof(int32_t));
    number = (int32_t *)malloc((size_t)count * sizeof(int32_t));
    order = (int32_t *)malloc((size_t)count * sizeof(int32_t));
    key = (int64_t *)malloc((size_t)count * sizeof(int64_t));
    if (depth == NULL || number == NULL || order == NULL || key == NULL || count < 1) {
        goto out;
    }
    for (int32_t s = count - 1; s >= 0; s--) {
        const int32_t *sig = signatures.pool.data + signatures.offsets[s];
        int64_t size = signatures.offsets[s + 1] - signatures.offsets[s];
        for (int64_t i = 1; i < size; i += 3) {
            int32_t child = sig[i + 2];
            depth[child] = depth[s] + 1 > depth[child] ? depth[s] + 1 : depth[child];
        }
        levels = depth[s] + 1 > levels ? depth[s] + 1 : levels;
    }
    level_count = (int32_t *)calloc((size_t)levels + 1, sizeof(int32_t));
    if (level_count == NULL) {
        goto out;
    }
    for (int32_t s = 0; s < count; s++) {
        level_count[depth[s] + 1]++;
    }
    for (int32_t l = 0; l < levels; l++) {
        level_count[l + 1] += level_count[l];
    }
    /* order: states by level; then level by level, each level sorted by its smallest edge in */
    for (int32_t s = count - 1; s >= 0; s--) {
        order[level_count[depth[s]]++] = s;
    }
    for (int32_t l = levels; l > 0; l--) {
        level_count[l] = level_count[l - 1];
    }
    level_count[0] = 0;
    /* level by level: sort the level by its members' smallest (source number, byte) in, number it, and
       offer its edges to the deeper levels' keys (every edge into a level comes from a lower one) */
    int64_t total = 0;
    for (int32_t s = 0; s < count; s++) {
        key[s] = INT64_MAX;
    }
    for (int32_t l = 0; l < levels; l++) {
        int32_t lo = level_count[l], hi = level_count[l + 1];
        int64_t *pairs = (int64_t *)malloc((size_t)(hi - lo) * 2 * sizeof(int64_t));
        if (pairs == NULL) {
            goto out;
        }
        for (int32_t i = lo; i < hi; i++) {
            pairs[2 * (i - lo)] = key[order[i]], pairs[2 * (i - lo) + 1] = order[i];
        }
        qsort(pairs, (size_t)(hi - lo), 2 * sizeof(int64_t), compare_int64); /* keys are distinct */
        for (int32_t i = lo; i < hi; i++) {
            order[i] = (int32_t)pairs[2 * (i - lo) + 1];
            number[order[i]] = i;
        }
        free(pairs);
        for (int32_t i = lo; i < hi; i++) {
            const int32_t *sig = signatures.pool.data + signatures.offsets[order[i]];
            int64_t size = signatures.offsets[order[i] + 1] - signatures.offsets[order[i]];
            for (int64_t j = 1; j < size; j += 3) {
                int32_t child = sig[j + 2];
                int64_t candidate = (int64_t)i * 256 + sig[j];
                key[child] = candidate < key[child] ? candidate : key[child];
                total += sig[j + 1] - sig[j] + 1;
            }
        }
    }
    /* the byte edges, by destination then source then byte: sources ascending, bytes ascending
       within a row, then a stable counting sort by destination */
    in_offsets = (int64_t *)calloc((size_t)count + 2, sizeof(int64_t));
    if (in_offsets == NULL) {
        goto out;
    }
    for (int32_t i = 0; i < count; i++) {
        const int32_t *sig = signatures.pool.data + signatures.offsets[order[i]];
        int64_t size = signatures.offsets[order[i] + 1] - signatures.offsets[order[i]];
        for (int64_t j = 1; j < size; j += 3) {
            in_offsets[number[sig[j + 2]] + 2] += sig[j + 1] - sig[j] + 1;
        }
    }
    for (int32_t i = 0; i <= count; i++) {
        in_offsets[i + 1] += in_offsets[i];
    }
    char *buffers[6];
    Py_ssize_t accepted = 0;
    for (int32_t s = 0; s < count; s++) {
        accepted += signatures.pool.data[signatures.offsets[s]] != 0;
    }
    Py_ssize_t sizes[6] = {((Py_ssize_t)count + 1) * 8, total * 4, total, total * 4, accepted * 4,
                           ((Py_ssize_t)levels + 1) * 8};
    for (int i = 0; i < 6; i++) {
        out[i] = new_bytes(sizes[i], &buffers[i]);
        if (out[i] == NULL) {
            for (int j = 0; j < i; j++) {
                Py_CLEAR(out[j]);
            }
            result = -2; /* the error is set */
            goto out;
        }
    }
    int32_t *source = (int32_t *)buffers[1], *dest = (int32_t *)buffers[3], *accepts = (int32_t *)buffers[4];
    uint8_t *byte = (uint8_t *)buffers[2];
    for (int32_t i = 0; i < count; i++) {
        const int32_t *sig = signatures.pool.data + signatures.offsets[order[i]];
        int64_t size = signatures.offsets[order[i] + 1] - signatures.offsets[order[i]];
        for (int64_t j = 1; j < size; j += 3) {
            int32_t to = number[sig[j + 2]];
            for (int32_t b = sig[j]; b <= sig[j + 1]; b++) {
                int64_t at = in_offsets[to + 1]++;
                source[at] = i, byte[at] = (uint8_t)b, dest[at] = to;
            }
        }
    }
    memcpy(buffers[0], in_offsets, ((size_t)count + 1) * sizeof(int64_t));
    Py_ssize_t a = 0;
    for (int32_t i = 0; i < count; i++) {
        if (signatures.pool.data[signatures.offsets[order[i]]]) {
            accepts[a++] = i;
        }
    }
    int64_t *level_offsets = (int64_t *)buffers[5];
    for (int32_t l = 0; l <= levels; l++) {
        level_offsets[l] = level_count[l];
    }
    result = 0;
out:
    free(depth), free(number), free(order), free(key), free(in_offsets), free(level_count);
    return result;
}

static PyObject *pattern_dag(PyObject *module, PyObject *args) {
    PyObject *program_obj;
    int max_nfa, max_dfa;
    long long max_work;
    if (!PyArg_ParseTuple(args, "OiiL", &program_obj, &max_nfa, &max_dfa, &max_work)) {
        return NULL;
    }
    Py_buffer view;
    if (get_array(program_obj, &view, 4, "program") < 0) {
        return NULL;
    }
    if (max_nfa < 2 || max_dfa < 1 || max_work < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "pattern_dag: limits must be positive");
        return NULL;
    }
    Nfa a = {.program = (const int32_t *)view.buf, .length = view.shape[0], .states = 2, .max_states = max_nfa};
    Dfa d = {0};
    const char *why = NULL;
    PyObject *result = NULL, *out[6] = {NULL};
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    if (program_skip(&a, 0, 0) != a.length) {
        a.error = "program"; /* malformed, or trailing entries */
    } else {
        nfa_build(&a, 0, 0, 1, 0);
    }
    why = a.no_memory ? "memory" : a.error;
    if (why == NULL) {
        why = determinise(&a, max_dfa, max_work, &d);
    }
    Py_END_ALLOW_THREADS
    free(a.eps.data), free(a.moves.data);
    if (why == NULL) {
        status = minimise(&d, out);
    }
    free(d.rows.data), free(d.rows_at), free(d.accepting);
    PyBuffer_Release(&view);
    if (why != NULL && strcmp(why, "memory") == 0) {
        return PyErr_NoMemory();
    }
    if (why != NULL && strcmp(why, "program") == 0) {
        PyErr_SetString(PyExc_ValueError, "pattern_dag: malformed program");
        return NULL;
    }
    if (why != NULL) {
        return PyUnicode_FromString(why);
    }
    if (status == -1) {
        return PyErr_NoMemory();
    }
    if (status == -2) {
        return NULL;
    }
    if (out[0] == Py_None) {
        return out[0];
    }
    result = PyTuple_Pack(6, out[0], out[1], out[2], out[3], out[4], out[5]);
    for (int i = 0; i < 6; i++) {
        Py_DECREF(out[i]);
    }
    return result;
}

/* dag_of_trie(parent i32[n], byte u8[n], terminal i32[k]) -> the ByteDag's six arrays, as
 * pattern_dag: the minimal acyclic automaton of a trie's strings (see triemask.base.dag, the
 * reference). The trie is breadth-first, as build_trie lays it out (checked: each parent before
 * its children, parents in order, siblings in ascending byte order), so visiting the nodes from
 * the last signs a node after its children: acceptance, then (byte, byte, class) per child. */
static PyObject *dag_of_trie(PyObject *module, PyObject *args) {
    PyObject *objs[3];
    if (!PyArg_ParseTuple(args, "OOO", &objs[0], &objs[1], &objs[2])) {
        return NULL;
    }
    Py_buffer views[3];
    static const Py_ssize_t sizes[3] = {4, 1, 4};
    static const char *names[3] = {"parent", "byte", "terminal"};
    int held = 0;
    PyObject *result = NULL, *out[6] = {NULL};
    for (int i = 0; i < 3; i++) {
        if (get_array(objs[i], &views[i], sizes[i], names[i]) < 0) {
            goto done;
        }
        held = i + 1;
    }
    const int32_t *parent = (const int32_t *)views[0].buf, *terminal = (const int32_t *)views[2].buf;
    const uint8_t *byte = (const uint8_t *)views[1].buf;
    Py_ssize_t n = views[0].shape[0], k = views[2].shape[0];
    int bad = n < 1 || n >= INT32_MAX || views[1].shape[0] != n;
    for (Py_ssize_t i = 1; !bad && i < n; i++) {
        bad = parent[i] < 0 || parent[i] >= i || (i > 1 && (parent[i] < parent[i - 1] ||
                                                            (parent[i] == parent[i - 1] && byte[i] <= byte[i - 1])));
    }
    for (Py_ssize_t i = 0; !bad && i < k; i++) {
        bad = terminal[i] < 0 || terminal[i] >= n;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "dag_of_trie: not a breadth-first trie");
        goto done;
    }
    int32_t *first = (int32_t *)malloc(((size_t)n + 1) * sizeof(int32_t)); /* first child; first[u + 1]: past */
    int32_t *canonical = (int32_t *)malloc((size_t)n * sizeof(int32_t));
    uint8_t *accepts = (uint8_t *)calloc((size_t)n, 1);
    Int32s signature = {0};
    Interned signatures;
    int ready = interned_init(&signatures) == 0;
    int failed = first == NULL || canonical == NULL || accepts == NULL || !ready;
    Py_BEGIN_ALLOW_THREADS
    if (!failed) {
        for (Py_ssize_t i = 0; i < k; i++) {
            accepts[terminal[i]] = 1;
        }
        /* children of u: first[u] .. first[u + 1], the children of the nodes before u first */
        memset(first, 0, ((size_t)n + 1) * sizeof(int32_t));
        for (Py_ssize_t i = 1; i < n; i++) {
            first[parent[i] + 1]++;
        }
        first[0] = 1;
        for (Py_ssize_t u = 0; u < n; u++) {
            first[u + 1] += first[u];
        }
    }
    for (int32_t u = (int32_t)n - 1; !failed && u >= 0; u--) {
        signature.size = 0;
        failed = ints_push(&signature, 1, accepts[u], 0, 0, 0) < 0;
        for (int32_t c = first[u]; !failed && c < first[u + 1]; c++) {
            failed = ints_push(&signature, 3, byte[c], byte[c], canonical[c], 0) < 0;
        }
        int added;
        failed = failed || (canonical[u] = intern(&signatures, signature.data, signature.size, &added)) < 0;
    }
    Py_END_ALLOW_THREADS
    int status = failed ? -1 : signatures_to_dag(&signatures, out);
    free(first), free(canonical), free(accepts), free(signature.data);
    if (ready) {
        interned_free(&signatures);
    }
    if (status == -1) {
        PyErr_NoMemory();
    } else if (status == 0) {
        result = PyTuple_Pack(6, out[0], out[1], out[2], out[3], out[4], out[5]);
        for (int i = 0; i < 6; i++) {
            Py_DECREF(out[i]);
        }
    }
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
    }
    return result;
}
