
/* The lazy layout (TrieAutomaton compiled with layout="lazy"): no edges are stored. A node's
 * edges are found on first use by walking its subtrie together with the vocabulary's forward
 * token trie (a token is allowed exactly when its bytes spell a path down from the node), and
 * kept in a byte-bounded LRU cache; the whole row too for nodes allowing half a row's worth of
 * tokens. The value trie is stored as one uint16 word per node (child count, terminal flag,
 * dead-end flag) and its byte, with first-child ids and terminal ranks sampled every 64 nodes.
 * The cache is only touched with the GIL held, which makes it thread-safe. */
#define LAZY_COUNT 0x1FFu     /* bits 0-8: number of children (0..256) */
#define LAZY_DEAD 0x4000u     /* no token sequence completes a value from here: no edge leads in */
#define LAZY_TERMINAL 0x8000u /* a value ends here */
#define DAG_NONE 0xFFu        /* no edge, in Lazy.dag_small */
#define RUN_MAX 48            /* the longest run of a small DAG held (Lazy.run_mask) */
#define RUN_WIDE 0x80u        /* Lazy.run_closed: the run takes WIDE_RUN_BYTES bytes or more */
#define WIDE_RUN_BYTES 32
#define NO_MEMORY INT32_MIN   /* next_of's answer when a lazy node's edges could not be built */

/* (a hot loop kept out of line where inlining it into its caller costs it registers) */
/* (a read of memory soon needed started early, where the loop cannot see that far ahead) */
#if defined(__GNUC__)
#define NOINLINE __attribute__((noinline))
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define NOINLINE
#define PREFETCH(address) ((void)(address))
#endif

/* Bytes in 54 groups: each ASCII punctuation character and digit alone, letters in four ranges
 * a case (a-f g-m n-s t-z), the controls, UTF-8 continuation and lead bytes. A
 * regex class is most often a union of groups, which lets a walk test a token-trie subtree's
 * bytes against it in one AND (TokenTrieTables.below). */
static int byte_group_of(int b) {
    if (b < 32 || b == 127) {
        return 0;
    }
    if (b >= 0x80) {
        return b < 0xC0 ? 1 : 2;
    }
    if ((b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z')) {
        int lower = b | 0x20, quarter = lower <= 'f' ? 0 : lower <= 'm' ? 1 : lower <= 's' ? 2 : 3;
        return 3 + (b >= 'a' ? 4 : 0) + quarter;
    }
    /* the rest of ASCII, 32 .. 126 less the letters: 43 characters, one group each */
    return 11 + (b < 'A' ? b - 32 : b < 'a' ? b - 32 - 26 : b - 32 - 52);
}

static uint8_t BYTE_GROUP[256];
static int BYTE_GROUP_SIZE[64];

/* (once, with the GIL held: the module's loading) */
static void byte_groups_init(void) {
    for (int b = 0; b < 256; b++) {
        BYTE_GROUP[b] = (uint8_t)byte_group_of(b);
        BYTE_GROUP_SIZE[BYTE_GROUP[b]]++;
    }
}

typedef struct Entry {
    struct Entry *newer, *older; /* the LRU list */
    struct Entry *chain;         /* the hash bucket's list */
    size_t bytes;
    uint32_t *row; /* the whole row, for wide nodes, else NULL */
    int32_t node, count;
    int32_t listed; /* 0: a DAG's wide node, its row alone (see lazy_compute) */
    int32_t data[]; /* tokens[count] ascending, then dests[count] (when listed), then the row */
} Entry;

/* TokenTrieTables(children i32, node_byte u8, token_offsets i32, token_ids i32, width): a
 * vocabulary's forward token trie (vocab.token_index.TokenTrie), checked once (a tree, children
 * after their parent and in range, offsets ascending, ids inside a row of `width` words) and held
 * for every lazy kernel of that vocabulary, which would otherwise check it again each (a
 * millisecond for a 150K vocabulary: the whole compile of a pattern in the lazy layout).
 *
 * The walks go down the given arrays, numbered breadth first: a node's children are contiguous
 * and in byte order, so finding the few a value-trie or DAG node can follow reads a line or two
 * (a narrow row's walk: 0.5 us for a date's). Beside them, a copy renumbered in depth-first
 * preorder (`pre` maps a node to it), where a node's subtree is the range [k, skip[k]): what a
 * walk matches whole (see Lazy.run_mask) it reads forward in one pass, and a token's bytes are
 * read up its parents (row_edge_to). Scanning siblings in preorder jumps over their subtrees, a
 * cache miss each: a narrow row 2-3x slower, which is why the walks do not use it. */
typedef struct TokenTrieTables {
    PyObject_HEAD
    Py_buffer views[4]; /* the given arrays: children, node_byte, token_offsets, token_ids */
    int held;
    const int32_t *children, *token_offsets, *token_ids; /* (their buffers) by breadth-first node u */
    const uint8_t *node_byte;
    int32_t *pre;         /* [nodes] u's number in preorder; the arrays below are by that number k */
    uint32_t *byte_depth; /* [nodes] node k's depth << 8 | the byte into it (0 for the root) */
    int32_t *skip;        /* [nodes] the end of k's subtree */
    int32_t *offsets;     /* [nodes + 1] the tokens ending at node k: ids[offsets[k] .. offsets[k + 1]) */
    int32_t *ids;         /* [tokens] */
    int32_t *parent;      /* [nodes] node k's parent (0 for the root) */
    uint64_t *below;      /* [nodes] by u: the groups (BYTE_GROUP) of the bytes below node u */
    uint8_t *height;      /* [nodes] by u: the longest path below node u, in bytes (at most 255) */
    int32_t *token_node;  /* [32 * width] the node a token id ends at, or -1: its bytes, read upwards */
    int32_t nodes;
    /* a miss's scratch, shared by the vocabulary's lazy kernels (a miss runs with the GIL held
     * from start to end): kept from one kernel to the next, so that a new pattern's wide first
     * row does not grow it again from nothing (an identifier's first mask 0.38 -> 0.32 ms) */
    uint64_t *keys;
    size_t keys_cap;
    int32_t *stack;
    size_t stack_cap;
    int ready;
    Py_ssize_t width;
} TokenTrieTables;

typedef struct {
    Py_buffer views[6]; /* node_byte, node_word, child_blocks, terminal_blocks, terminal_values, slot_dest */
    int held;
    PyObject *token_trie; /* TokenTrieTables (owned); `tok` the same, typed */
    TokenTrieTables *tok; /* (its scratch written by misses) */
    /* A trie's node v has children first(v) .. first(v) + count - 1, node_byte[child] the byte
     * into each. A DAG (a pattern's automaton) numbers its out-edges instead, "slots" in the
     * same places, node_byte by slot; slot_dest[slot] the node an edge leads to (NULL: a trie,
     * where the slot is the child) */
    const int32_t *slot_dest;
    /* a DAG's out-bytes per node as four 64-bit words, and the slot of the first byte of each
     * word: a child found with a bit test and a popcount (made by lazy_kernel; NULL for a trie,
     * whose children are merged with the token trie's) */
    uint64_t *dag_bits;
    int32_t *dag_rank;
    /* a DAG of fewer than DAG_NONE nodes: each node's destination by byte besides, 256 bytes a
     * node (DAG_NONE: no edge), one load where the bits take a dozen dependent operations (an
     * identifier pattern's widest walk 13% faster) */
    uint8_t *dag_small;
    /* and its runs: run_node[c * (RUN_MAX + 1) + m] the node m bytes below c where every byte of
     * a group in run_mask[same] leads to one node at each step (DAG_NONE past the run), so that a
     * token-trie subtree whose bytes are all in those groups is matched whole (see lazy_walk);
     * run_to[same] that node where tokens may end there, else -1 (past the run, or LAZY_DEAD) */
    uint64_t *run_mask;
    uint8_t *run_node;
    int16_t *run_to;
    /* run_step[c] the groups of c's own run step; run_closed[c] how many steps on from c every
     * byte out of a node is in those (a byte outside ends a match), | RUN_WIDE (lazy_scan_run) */
    uint64_t *run_step;
    uint8_t *run_closed;
    const uint8_t *node_byte;
    const uint16_t *node_word;
    const int32_t *child_blocks, *terminal_blocks, *terminal_values;
    int32_t *eos;
    Py_ssize_t n_eos;
    Entry **buckets;
    int bucket_bits;
    size_t entries, bytes, limit;
    Entry *newest, *oldest, *transient; /* transient: a row larger than the bound, kept for one call */
    unsigned long long hits, misses, evictions;
    int32_t *listing; /* a row-only node's tokens and dests, listed for edges() and pairs() */
    size_t listing_cap;
} Lazy;

/* An updated set (UpdatedTrieAutomaton): its base automaton's Kernel, the delta's (the added
 * values; NULL when none were added) and the base nodes whose edges the removals cut, with the
 * tokens each loses, as a CSR of their own. A state is a pair (base state, delta state), one
 * part DEAD (-1) or both at nodes of the same prefix, numbered in three ranges: [0, B) the base
 * state alone, [B, B + D) the delta state alone, [B + D, B + D + Dn) delta node d with its
 * partner[d], the base node spelling the same prefix (B, D: the parts' state counts, Dn the
 * delta's nodes); no division, and as many states as the parts have (a pair number would
 * pass 2**31 with a delta of thousands on a base of millions). A token is allowed where either
 * part allows it, the base's less the cut tokens. Nothing of the base is copied: a step looks the
 * token up in each part at a node (and in the node's cut tokens where the base part was cut: a
 * bit per base node tells), a fill writes the base's row, clears the cut tokens' bits and ORs in
 * the delta's. Building one costs the cut tokens, not the rows they are cut from. */
typedef struct {
    PyObject *base, *delta;             /* Kernels, owned references */
    int64_t base_states, delta_states;  /* B and D */
    Py_buffer nodes, offsets, tokens;   /* int32: the cut nodes ascending, the tokens each loses */
    Py_buffer partner;                  /* int32 per delta node: its base node, or -1 */
    int held;                           /* how many of the buffers are held */
    uint64_t *cut;                      /* a bit per base node: set where it lost tokens */
} Patch;

typedef struct {
    PyObject_HEAD
    Py_buffer edge_offsets; /* int32, num_nodes + 2 */
    Py_buffer edge_tokens;  /* int32 */
    Py_buffer edge_dests;   /* int32 */
    Py_buffer dense_nodes;  /* int32, ascending: the nodes stored as whole rows */
    Py_buffer dense_rows;   /* int32, one row of `width` words per dense node */
    int held;               /* how many of the buffers above are held */
    int64_t num_nodes;
    int64_t num_states;
    Py_ssize_t width;
    int64_t dense_min;      /* only a node with at least this many edges can be dense */
    Lazy *lazy;             /* the lazy layout (the buffers above unused), or NULL */
    Patch *patch;           /* an updated set's parts (the buffers above unused), or NULL */
} Kernel;

static PyTypeObject KernelType;

static int get_array(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    if (view->ndim != 1 || view->itemsize != itemsize) {
        PyErr_Format(PyExc_ValueError, "%s must be a 1-D array of %zd-byte integers", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void lazy_free(Lazy *z) {
    if (z == NULL) {
        return;
    }
    for (Entry *e = z->newest; e != NULL;) {
        Entry *older = e->older;
        free(e);
        e = older;
    }
    free(z->transient);
    free(z->buckets);
    free(z->listing);
    Py_XDECREF(z->token_trie);
    PyMem_Free(z->dag_bits);
    PyMem_Free(z->dag_rank);
    PyMem_Free(z->dag_small);
    PyMem_Free(z->run_mask);
    PyMem_Free(z->run_node);
    PyMem_Free(z->run_to);
    PyMem_Free(z->run_step);
    PyMem_Free(z->run_closed);
    for (int i = 0; i < z->held; i++) {
        PyBuffer_Release(&z->views[i]);
    }
    PyMem_Free(z);
}

static void Kernel_dealloc(Kernel *self) {
    Py_buffer *views[5] = {&self->edge_offsets, &self->edge_tokens, &self->edge_dests, &self->dense_nodes,
                           &self->dense_rows};
    for (int i = 0; i < self->held; i++) {
        PyBuffer_Release(views[i]);
    }
    lazy_free(self->lazy);
    if (self->patch != NULL) {
        Py_buffer *parts[4] = {&self->patch->nodes, &self->patch->offsets, &self->patch->tokens,
                               &self->patch->partner};
        for (int i = 0; i < self->patch->held; i++) {
            PyBuffer_Release(parts[i]);
        }
        Py_XDECREF(self->patch->base);
        Py_XDECREF(self->patch->delta);
        PyMem_Free(self->patch->cut);
        PyMem_Free(self->patch);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Kernel_init(Kernel *self, PyObject *args, PyObject *kwds) {
    PyObject *objs[5];
    long long num_nodes, num_states, dense_min;
    Py_ssize_t width;
    if (self->held || self->lazy || self->patch) {
        PyErr_SetString(PyExc_RuntimeError, "Kernel is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOLLnL", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &num_nodes,
                          &num_states, &width, &dense_min)) {
        return -1;
    }
    Py_buffer *views[5] = {&self->edge_offsets, &self->edge_tokens, &self->edge_dests, &self->dense_nodes,
                           &self->dense_rows};
    static const char *names[5] = {"edge_offsets", "edge_tokens", "edge_dests", "dense_nodes", "dense_rows"};
    for (int i = 0; i < 5; i++) {
        if (get_array(objs[i], views[i], 4, names[i]) < 0) {
            return -1;
        }
        self->held = i + 1;
    }
    if (num_nodes < 0 || num_states < num_nodes || width < 1 || width > ((int64_t)1 << 26) ||
        self->edge_offsets.shape[0] != num_nodes + 2 || self->edge_tokens.shape[0] != self->edge_dests.shape[0]) {
        PyErr_SetString(PyExc_ValueError, "inconsistent automaton arrays");
        return -1;
    }
    /* Every offset, token and destination is checked once here, so that no later call can
       read or write out of bounds whatever the arrays hold. */
    const int32_t *eo = (const int32_t *)self->edge_offsets.buf;
    const int32_t *tokens = (const int32_t *)self->edge_tokens.buf;
    const int32_t *dests = (const int32_t *)self->edge_dests.buf;
    Py_ssize_t edges = self->edge_tokens.shape[0];
    int bad = eo[0] != 0;
    uint64_t limit = 32 * (uint64_t)width; /* a token's bit lies in the row */
    /* without the GIL: a file's checksums are verified on other threads meanwhile */
    Py_BEGIN_ALLOW_THREADS
    /* bitwise, branch-free checks: the compiler vectorises them */
    for (int64_t i = 1; i < num_nodes + 2; i++) {
        bad |= (eo[i] < eo[i - 1]) | (eo[i] > edges);
    }
    /* as unsigned 32-bit values a negative id is >= 2**31, so bounds above that are clamped to it */
    uint32_t states_bound = num_states > INT32_MAX ? (uint32_t)INT32_MAX + 1 : (uint32_t)num_states;
    uint32_t token_bound = limit > INT32_MAX ? (uint32_t)INT32_MAX + 1 : (uint32_t)limit;
    uint32_t over = 0;
    for (Py_ssize_t i = 0; i < edges; i++) {
        over |= ((uint32_t)dests[i] >= states_bound) | ((uint32_t)tokens[i] >= token_bound);
    }
    bad |= over != 0;
    Py_END_ALLOW_THREADS
    const int32_t *dense = (const int32_t *)self->dense_nodes.buf;
    Py_ssize_t n_dense = self->dense_nodes.shape[0];
    bad |= dense_min < 1 || self->dense_rows.shape[0] != (Py_ssize_t)n_dense * width;
    for (Py_ssize_t i = 0; i < n_dense; i++) {
        bad |= dense[i] < 0 || dense[i] >= num_nodes || (i > 0 && dense[i] <= dense[i - 1]);
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "automaton offsets, tokens, destinations or dense rows out of range");
        return -1;
    }
    self->dense_min = dense_min;
    self->num_nodes = num_nodes;
    self->num_states = num_states;
    self->width = width;
    return 0;
}

/* The state as a C integer when it is an exact int (bools and numpy scalars go to Python). */
static int exact_int(PyObject *obj, int64_t *out) {
    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (value == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)value;
    return 1;
}

/* A growing int32 array, malloc'd (usable with the GIL released): the walks' stacks and finds,
 * the tombstone pass's cuts. */
typedef struct {
    int32_t *data;
    int64_t size, capacity;
} Int32s;

/* Room for `more` entries past the size. */
static int ints_reserve(Int32s *v, int64_t more) {
    if (v->size + more > v->capacity) {
        int64_t capacity = v->capacity ? 2 * v->capacity : 1024;
        while (capacity < v->size + more) {
            capacity *= 2;
        }
        int32_t *grown = (int32_t *)realloc(v->data, (size_t)capacity * sizeof(int32_t));
        if (grown == NULL) {
            return -1;
        }
        v->data = grown, v->capacity = capacity;
    }
    return 0;
}

/* Appends `width` (<= 4) of a, b, c, d. */
static inline int ints_push(Int32s *v, int width, int32_t a, int32_t b, int32_t c, int32_t d) {
    if (v->size + width > v->capacity && ints_reserve(v, width) < 0) {
        return -1;
    }
    const int32_t values[4] = {a, b, c, d};
    memcpy(v->data + v->size, values, (size_t)width * sizeof(int32_t));
    v->size += width;
    return 0;
}

static inline int ints_append(Int32s *v, int32_t value) {
    return ints_push(v, 1, value, 0, 0, 0);
}

/* `count` more entries at the end, uninitialised. */
static int ints_extend(Int32s *v, int64_t count) {
    if (ints_reserve(v, count) < 0) {
        return -1;
    }
    v->size += count;
    return 0;
}

/* `count` entries of `data` appended (none: `data` not read, which may then be NULL). */
static int ints_concat(Int32s *v, const int32_t *data, int64_t count) {
    int64_t end = v->size;
    if (count <= 0) {
        return 0;
    }
    if (ints_extend(v, count) < 0) {
        return -1;
    }
    memcpy(v->data + end, data, (size_t)count * sizeof(int32_t));
    return 0;
}

/* Sort keys ascending (a node's edge keys, distinct; the tombstone pass's nodes): insertion
 * sort for the few edges most nodes have, quicksort with median-of-three pivots above, no
 * comparator calls. */
static void sort_keys(uint64_t *a, int64_t n) {
    while (n > 24) {
        uint64_t x = a[0], y = a[n / 2], z = a[n - 1];
        uint64_t pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t i = 0, j = n - 1;
        for (;;) {
            while (a[i] < pivot) {
                i++;
            }
            while (a[j] > pivot) {
                j--;
            }
            if (i >= j) {
                break;
            }
            uint64_t swap = a[i];
            a[i++] = a[j], a[j--] = swap;
        }
        /* recurse into the smaller part, loop on the larger: the stack stays logarithmic */
        if (j + 1 < n - j - 1) {
            sort_keys(a, j + 1);
            a += j + 1, n -= j + 1;
        } else {
            sort_keys(a + j + 1, n - j - 1);
            n = j + 1;
        }
    }
    for (int64_t i = 1; i < n; i++) {
        uint64_t key = a[i];
        int64_t j = i - 1;
        while (j >= 0 && a[j] > key) {
            a[j + 1] = a[j];
            j--;
        }
        a[j + 1] = key;
    }
}

/* The set bits of `word`, inline (the builtin is a library call where the build does not
 * assume the CPU's instruction). */
static inline int popcount64(uint64_t word) {
    word = word - ((word >> 1) & 0x5555555555555555ULL);
    word = (word & 0x3333333333333333ULL) + ((word >> 2) & 0x3333333333333333ULL);
    word = (word + (word >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
    return (int)((word * 0x0101010101010101ULL) >> 56);
}

/* Keys (token << 32 | dest) whose tokens are distinct (one edge per token at a node), sorted:
 * by the token's bits, 11 at a time from the lowest (each pass a stable counting sort), where
 * there are enough of them for that to beat sort_keys (a node allowing tens of thousands of
 * tokens: an identifier pattern's first row on Qwen2.5 took 4.3 ms with sort_keys, 2.9 ms so);
 * sort_keys otherwise, or when the scratch array cannot be had. */
enum { TOKEN_RADIX_MIN = 2048, TOKEN_RADIX_BITS = 11 };

static void sort_token_keys(uint64_t *keys, int64_t n) {
    uint64_t *scratch = n >= TOKEN_RADIX_MIN ? (uint64_t *)malloc((size_t)n * sizeof(uint64_t)) : NULL;
    if (scratch == NULL) {
        sort_keys(keys, n);
        return;
    }
    uint64_t highest = 0;
    for (int64_t i = 0; i < n; i++) {
        highest |= keys[i] >> 32;
    }
    uint64_t *from = keys, *to = scratch;
    for (int shift = 32; shift < 64 && (highest >> (shift - 32)) != 0; shift += TOKEN_RADIX_BITS) {
        int64_t counts[(1 << TOKEN_RADIX_BITS) + 1] = {0};
        for (int64_t i = 0; i < n; i++) {
            counts[((from[i] >> shift) & ((1 << TOKEN_RADIX_BITS) - 1)) + 1]++;
        }
        for (int d = 0; d < (1 << TOKEN_RADIX_BITS); d++) {
            counts[d + 1] += counts[d];
        }
        for (int64_t i = 0; i < n; i++) {
            to[counts[(from[i] >> shift) & ((1 << TOKEN_RADIX_BITS) - 1)]++] = from[i];
        }
        uint64_t *swap = from;
        from = to, to = swap;
    }
    if (from != keys) {
        memcpy(keys, from, (size_t)n * sizeof(uint64_t));
    }
    free(scratch);
}

/* A new bytearray of `size` bytes (none when size <= 0) and its data, or NULL with an error set. */
static PyObject *new_bytes(Py_ssize_t size, char **data) {
    PyObject *out = PyByteArray_FromStringAndSize(NULL, size > 0 ? size : 0);
    if (out != NULL) {
        *data = PyByteArray_AS_STRING(out);
    }
    return out;
}
