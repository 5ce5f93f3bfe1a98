/*
 * triemask._native: the per-step and batch loops of TrieAutomaton in C.
 *
 * A Kernel holds read-only views (the buffer protocol, no NumPy headers) of one
 * automaton's CSR arrays and answers the hot calls:
 *
 *   next(state, token)            -> int, or None when the arguments need Python's checks
 *   fill(bitmask, row, state)     -> True, or None (same)
 *   fill_batch(bitmask, states, rows) -> True, or None (same); the GIL is released
 *   next_batch(states, tokens, out)   -> True, or None (same); the GIL is released
 *
 * (states, rows and tokens: lists or tuples of exact ints, or int64 arrays)
 *
 * "None" never means "not allowed": it hands the call back to the NumPy reference
 * implementation, which raises the typed error (a bool, a numpy scalar, a torch tensor,
 * a state outside the automaton, a buffer of the wrong shape). The C side only takes
 * exact Python ints and int32 / int64 C-contiguous buffers it has checked itself, so a
 * call either does what the reference does or defers to it. Every array the kernel
 * indexes is range-checked once when the Kernel is built.
 *
 * States: 0 .. num_nodes - 1 are nodes, num_nodes .. num_states - 1 final states, -1
 * DEAD; final and DEAD allow nothing.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
#define NO_MEMORY INT32_MIN   /* next_of's answer when a lazy node's edges could not be built */

typedef struct Entry {
    struct Entry *newer, *older; /* the LRU list */
    struct Entry *chain;         /* the hash bucket's list */
    size_t bytes;
    uint32_t *row; /* the whole row, for wide nodes, else NULL */
    int32_t node, count;
    int32_t data[]; /* tokens[count] ascending, then dests[count], then the row */
} Entry;

typedef struct {
    Py_buffer views[9];
    int held;
    const uint8_t *node_byte;
    const uint16_t *node_word;
    const int32_t *child_blocks, *terminal_blocks, *terminal_values;
    const int32_t *tok_children, *tok_offsets, *tok_ids; /* the forward token trie */
    const uint8_t *tok_byte;
    int32_t *eos;
    Py_ssize_t n_eos;
    Entry **buckets;
    int bucket_bits;
    size_t entries, bytes, limit;
    Entry *newest, *oldest, *transient; /* transient: a row larger than the bound, kept for one call */
    unsigned long long hits, misses, evictions;
    uint64_t *keys; /* scratch of a miss */
    size_t keys_cap;
    int32_t *stack;
    size_t stack_cap;
} Lazy;

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
    free(z->keys);
    free(z->stack);
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
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Kernel_init(Kernel *self, PyObject *args, PyObject *kwds) {
    PyObject *objs[5];
    long long num_nodes, num_states, dense_min;
    Py_ssize_t width;
    if (self->held || self->lazy) {
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

/* Sort a node's edge keys ascending (keys are distinct): insertion sort for the few edges
 * most nodes have, quicksort with median-of-three pivots above, no comparator calls. */
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
 * spelling the same bytes below `node`; each token ending at u is an edge node -> v. */
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
        int32_t first = lazy_first_child(z, v);
        if (grow((void **)&z->stack, &z->stack_cap, 2 * (sp + (size_t)count), sizeof(int32_t)) < 0) {
            return NULL;
        }
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
    sort_keys(z->keys, (int64_t)nk);
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

/* ------------------------------------------------------------------ a node's edges */

typedef struct {
    const int32_t *tokens, *dests;
    int32_t count;
    const uint32_t *row; /* the whole row when the lazy cache holds it, else NULL */
} Edges;

/* The edges of trie node `node` (0 <= node < num_nodes): 0, or -1 when the lazy layout ran
 * out of memory building them. They stay valid until the next call. */
static inline int node_edges(const Kernel *self, int64_t node, Edges *out) {
    Lazy *z = self->lazy;
    if (z == NULL) {
        const int32_t *offsets = (const int32_t *)self->edge_offsets.buf;
        int32_t lo = offsets[node];
        out->tokens = (const int32_t *)self->edge_tokens.buf + lo;
        out->dests = (const int32_t *)self->edge_dests.buf + lo;
        out->count = offsets[node + 1] - lo;
        out->row = NULL;
        return 0;
    }
    Entry *e = z->buckets[bucket_of(z, (int32_t)node)];
    while (e != NULL && e->node != node) {
        e = e->chain;
    }
    if (e != NULL) {
        z->hits++;
        if (z->newest != e) {
            lazy_unlink(z, e);
            lazy_push_front(z, e);
        }
    } else {
        z->misses++;
        free(z->transient);
        z->transient = NULL;
        e = lazy_compute(self, (int32_t)node);
        if (e == NULL) {
            return -1;
        }
        lazy_insert(z, e);
    }
    out->tokens = e->data;
    out->dests = e->data + e->count;
    out->count = e->count;
    out->row = e->row;
    return 0;
}

static inline int32_t next_of(const Kernel *self, int64_t state, int64_t token) {
    if (state < 0 || state >= self->num_nodes) {
        return -1; /* final and DEAD states allow nothing */
    }
    Edges e;
    if (node_edges(self, state, &e) < 0) {
        return NO_MEMORY;
    }
    int32_t lo = 0, hi = e.count;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (e.tokens[mid] < token) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < e.count && e.tokens[lo] == token ? e.dests[lo] : -1;
}

/* A row from the node's tokens (the automaton stores no bitmask words: setting one bit per
   allowed token costs what copying the words did, and saves their memory), or, for the few
   nodes allowing half a row's worth of tokens or more, a copy of the row stored whole.
   0, or -1 when the lazy layout ran out of memory. */
static inline int fill_one(const Kernel *self, int32_t *row, int64_t node) {
    Edges e;
    if (node < 0 || node >= self->num_nodes) {
        memset(row, 0, (size_t)self->width * sizeof(int32_t));
        return 0;
    }
    if (node_edges(self, node, &e) < 0) {
        return -1;
    }
    if (e.row != NULL) {
        memcpy(row, e.row, (size_t)self->width * 4);
        return 0;
    }
    if (self->lazy == NULL && e.count >= self->dense_min) {
        /* a node allowing a large part of the vocabulary: its row is stored whole */
        const int32_t *dense = (const int32_t *)self->dense_nodes.buf;
        Py_ssize_t lo = 0, hi = self->dense_nodes.shape[0];
        while (lo < hi) {
            Py_ssize_t mid = lo + (hi - lo) / 2;
            if (dense[mid] < node) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if (lo < self->dense_nodes.shape[0] && dense[lo] == node) {
            memcpy(row, (const int32_t *)self->dense_rows.buf + lo * self->width, (size_t)self->width * 4);
            return 0;
        }
    }
    memset(row, 0, (size_t)self->width * sizeof(int32_t));
    uint32_t *words = (uint32_t *)row;
    for (int32_t i = 0; i < e.count; i++) {
        words[(uint32_t)e.tokens[i] >> 5] |= 1u << ((uint32_t)e.tokens[i] & 31);
    }
    return 0;
}

static int valid_state(const Kernel *self, int64_t state) {
    return state >= -1 && state < self->num_states;
}

static PyObject *Kernel_next(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t state, token;
    if (nargs != 2 || !exact_int(args[0], &state) || !exact_int(args[1], &token) || !valid_state(self, state)) {
        Py_RETURN_NONE;
    }
    int32_t following = next_of(self, state, token);
    return following == NO_MEMORY ? PyErr_NoMemory() : PyLong_FromLong(following);
}

/* The per-step fill spends most of its time in NumPy's buffer export (about 0.3 us, as
 * much as writing the row), so Kernel.fill reads an exact numpy.ndarray's header
 * directly: the layout of NumPy's PyArrayObject_fields, stable since NumPy 1.7 and part of
 * its ABI. The mirror is trusted only after enable_ndarray_headers() has checked it on
 * probe arrays built by Python (address, shape, strides and flags read both ways), and
 * only for arrays whose dtype object is the probe's int32 singleton; anything else takes
 * the buffer protocol. It is used with the GIL held for the whole call only. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions;
    Py_ssize_t *strides;
    PyObject *base;
    PyObject *descr;
    int flags;
} ArrayHeader;

enum { ARRAY_C_CONTIGUOUS = 0x0001, ARRAY_ALIGNED = 0x0100, ARRAY_WRITEABLE = 0x0400 };
static PyTypeObject *ndarray_type = NULL; /* set once the mirror is checked */
static PyObject *int32_descr = NULL;

static int header_matches(PyObject *probe, int writable, int contiguous) {
    Py_buffer view;
    if (PyObject_GetBuffer(probe, &view, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return 0;
    }
    const ArrayHeader *h = (const ArrayHeader *)probe;
    int ok = h->data == (char *)view.buf && h->nd == view.ndim && view.ndim == 2 && view.itemsize == 4 &&
             ((h->flags & ARRAY_WRITEABLE) != 0) == writable && ((h->flags & ARRAY_C_CONTIGUOUS) != 0) == contiguous &&
             (view.readonly == 0) == writable;
    for (int i = 0; ok && i < 2; i++) {
        ok = h->dimensions[i] == view.shape[i] && h->strides[i] == view.strides[i];
    }
    PyBuffer_Release(&view);
    return ok;
}

/* enable_ndarray_headers(writable, readonly, transposed) -> bool: three int32 2-D probes
 * (a fresh writable array, a read-only one, a non-contiguous view), all of one dtype. */
static PyObject *enable_ndarray_headers(PyObject *module, PyObject *args) {
    PyObject *writable, *readonly, *transposed;
    if (!PyArg_ParseTuple(args, "OOO", &writable, &readonly, &transposed)) {
        return NULL;
    }
    PyTypeObject *type = Py_TYPE(writable);
    if (ndarray_type != NULL || Py_TYPE(readonly) != type || Py_TYPE(transposed) != type ||
        type->tp_basicsize < (Py_ssize_t)sizeof(ArrayHeader)) {
        return PyBool_FromLong(ndarray_type != NULL);
    }
    const ArrayHeader *w = (const ArrayHeader *)writable;
    if (!header_matches(writable, 1, 1) || !header_matches(readonly, 0, 1) || !header_matches(transposed, 1, 0) ||
        !(w->flags & ARRAY_ALIGNED) || w->descr != ((const ArrayHeader *)readonly)->descr || w->descr == NULL) {
        Py_RETURN_FALSE;
    }
    Py_INCREF(type);
    Py_INCREF(w->descr);
    ndarray_type = type;
    int32_descr = w->descr;
    Py_RETURN_TRUE;
}

/* A writable, C-contiguous 2-D int32 buffer of the automaton's width. */
static int get_bitmask(const Kernel *self, PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS) < 0) {
        PyErr_Clear();
        return 0;
    }
    /* int32: "i" (or "l" where C long is 32 bits), possibly after a byte-order mark */
    const char *format = view->format == NULL ? "B" : view->format;
    if (*format == '=' || *format == '<' || *format == '@') {
        format++;
    }
    if (view->ndim != 2 || view->itemsize != 4 || (strcmp(format, "i") != 0 && strcmp(format, "l") != 0) ||
        view->readonly || view->shape[1] != self->width || view->strides[1] != 4 ||
        view->strides[0] != 4 * view->shape[1]) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* Fill row `row` of `target` with the mask of `state` (a valid state): 1 when done, 0 to
 * defer (a buffer the kernel does not take, a row outside it), -1 with MemoryError set. */
static int fill_into(const Kernel *self, PyObject *target, int64_t row, int64_t state) {
    if (Py_TYPE(target) == ndarray_type) {
        const ArrayHeader *h = (const ArrayHeader *)target;
        const int needed = ARRAY_C_CONTIGUOUS | ARRAY_ALIGNED | ARRAY_WRITEABLE;
        if (h->descr == int32_descr && h->nd == 2 && (h->flags & needed) == needed && h->dimensions[1] == self->width) {
            if (row < 0 || row >= h->dimensions[0]) {
                return 0;
            }
            return fill_one(self, (int32_t *)h->data + row * self->width, state) < 0 ? (PyErr_NoMemory(), -1) : 1;
        }
    }
    Py_buffer view;
    if (!get_bitmask(self, target, &view)) {
        return 0;
    }
    int done = row >= 0 && row < view.shape[0];
    if (done && fill_one(self, (int32_t *)view.buf + row * self->width, state) < 0) {
        PyErr_NoMemory();
        done = -1;
    }
    PyBuffer_Release(&view);
    return done;
}

static PyObject *Kernel_fill(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t row, state;
    if (nargs != 3 || !exact_int(args[1], &row) || !exact_int(args[2], &state) || !valid_state(self, state)) {
        Py_RETURN_NONE;
    }
    int done = fill_into(self, args[0], row, state);
    if (done < 0) {
        return NULL;
    }
    if (!done) {
        Py_RETURN_NONE;
    }
    Py_RETURN_TRUE;
}

/* A sequence of integers as a C int64 array: a list or tuple of exact ints (copied), or a
   1-D C-contiguous int64 buffer (viewed). Returns 0 to defer to Python. */
typedef struct {
    const int64_t *data;
    Py_ssize_t size;
    int64_t *owned;
    Py_buffer view;
    int has_view;
} Ints;

static int get_ints(PyObject *obj, Ints *out) {
    out->owned = NULL;
    out->has_view = 0;
    if (PyList_CheckExact(obj) || PyTuple_CheckExact(obj)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
        PyObject **items = PySequence_Fast_ITEMS(obj);
        out->owned = (int64_t *)PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
        if (out->owned == NULL) {
            PyErr_Clear();
            return 0;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!exact_int(items[i], &out->owned[i])) {
                PyMem_Free(out->owned);
                out->owned = NULL;
                return 0;
            }
        }
        out->data = out->owned;
        out->size = n;
        return 1;
    }
    if (PyObject_GetBuffer(obj, &out->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        return 0;
    }
    const char *format = out->view.format == NULL ? "B" : out->view.format;
    if (*format == '=' || *format == '<' || *format == '@') {
        format++;
    }
    if (out->view.ndim != 1 || out->view.itemsize != 8 || (strcmp(format, "l") != 0 && strcmp(format, "q") != 0)) {
        PyBuffer_Release(&out->view);
        return 0;
    }
    out->has_view = 1;
    out->data = (const int64_t *)out->view.buf;
    out->size = out->view.shape[0];
    return 1;
}

static void release_ints(Ints *ints) {
    if (ints->owned != NULL) {
        PyMem_Free(ints->owned);
    }
    if (ints->has_view) {
        PyBuffer_Release(&ints->view);
    }
}

static PyObject *Kernel_fill_batch(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_buffer mask;
    Ints states, rows;
    int have_rows = 0;
    if (nargs != 3) {
        Py_RETURN_NONE;
    }
    if (!get_bitmask(self, args[0], &mask)) {
        Py_RETURN_NONE;
    }
    if (!get_ints(args[1], &states)) {
        PyBuffer_Release(&mask);
        Py_RETURN_NONE;
    }
    if (args[2] != Py_None) {
        if (!get_ints(args[2], &rows)) {
            PyBuffer_Release(&mask);
            release_ints(&states);
            Py_RETURN_NONE;
        }
        have_rows = 1;
    }
    Py_ssize_t batch = states.size, height = mask.shape[0];
    const int64_t *s = states.data;
    const int64_t *r = have_rows ? rows.data : NULL;
    int ok = (have_rows ? rows.size == batch : batch <= height);
    for (Py_ssize_t i = 0; ok && i < batch; i++) {
        ok = valid_state(self, s[i]) && (!have_rows || (r[i] >= 0 && r[i] < height));
    }
    if (ok && have_rows && batch > 1) { /* rows must be distinct, as the reference requires */
        unsigned char *seen = (unsigned char *)PyMem_Calloc((size_t)height, 1);
        if (seen == NULL) {
            PyErr_Clear();
            ok = 0;
        }
        for (Py_ssize_t i = 0; ok && i < batch; i++) {
            ok = !seen[r[i]];
            seen[r[i]] = 1;
        }
        PyMem_Free(seen);
    }
    int failed = 0;
    if (ok) {
        int32_t *base = (int32_t *)mask.buf;
        PyThreadState *saved = self->lazy ? NULL : PyEval_SaveThread(); /* the lazy cache needs the GIL */
        for (Py_ssize_t i = 0; i < batch && !failed; i++) {
            failed = fill_one(self, base + (have_rows ? r[i] : i) * self->width, s[i]) < 0;
        }
        if (saved) {
            PyEval_RestoreThread(saved);
        }
    }
    PyBuffer_Release(&mask);
    release_ints(&states);
    if (have_rows) {
        release_ints(&rows);
    }
    if (failed) {
        return PyErr_NoMemory();
    }
    if (!ok) {
        Py_RETURN_NONE;
    }
    Py_RETURN_TRUE;
}

static PyObject *Kernel_next_batch(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    Ints states, tokens;
    Py_buffer out;
    if (nargs != 3) {
        Py_RETURN_NONE;
    }
    if (!get_ints(args[0], &states)) {
        Py_RETURN_NONE;
    }
    if (!get_ints(args[1], &tokens)) {
        release_ints(&states);
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(args[2], &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        release_ints(&states);
        release_ints(&tokens);
        Py_RETURN_NONE;
    }
    Py_ssize_t batch = states.size;
    const int64_t *s = states.data, *t = tokens.data;
    int ok = out.ndim == 1 && out.itemsize == 4 && tokens.size == batch && out.shape[0] == batch;
    for (Py_ssize_t i = 0; ok && i < batch; i++) {
        ok = valid_state(self, s[i]);
    }
    int failed = 0;
    if (ok) {
        int32_t *o = (int32_t *)out.buf;
        PyThreadState *saved = self->lazy ? NULL : PyEval_SaveThread(); /* the lazy cache needs the GIL */
        for (Py_ssize_t i = 0; i < batch && !failed; i++) {
            o[i] = next_of(self, s[i], t[i]);
            failed = o[i] == NO_MEMORY;
        }
        if (saved) {
            PyEval_RestoreThread(saved);
        }
    }
    release_ints(&states);
    release_ints(&tokens);
    PyBuffer_Release(&out);
    if (failed) {
        return PyErr_NoMemory();
    }
    if (!ok) {
        Py_RETURN_NONE;
    }
    Py_RETURN_TRUE;
}

/* ------------------------------------------------------------------ compilation */

static PyObject *new_bytes(Py_ssize_t size, char **data) {
    PyObject *out = PyByteArray_FromStringAndSize(NULL, size > 0 ? size : 0);
    if (out != NULL) {
        *data = PyByteArray_AS_STRING(out);
    }
    return out;
}

typedef struct {
    const int32_t *dense;
    int64_t dense_nodes;
    const uint64_t *table;
    uint64_t mask;
    int shift;
    int32_t sentinel;
} Index;

static inline int32_t index_child(const Index *ix, int32_t u, uint8_t b) {
    if (u < ix->dense_nodes) {
        return ix->dense[(int64_t)u * 256 + b];
    }
    uint64_t key = ((uint64_t)u << 8) | b;
    uint64_t slot = (key * 0x9E3779B97F4A7C15ULL) >> ix->shift;
    for (;;) {
        uint64_t entry = ix->table[slot];
        if (entry == UINT64_MAX) {
            return ix->sentinel;
        }
        if ((entry >> 32) == key) {
            return (int32_t)(entry & 0xFFFFFFFFULL);
        }
        slot = (slot + 1) & ix->mask;
    }
}

/* Tables(dense, dense_nodes, hash_table, hash_shift, first_token, has_children,
 *        dup_offsets|None, dup_tokens|None): a token index's transition tables, checked
 *        once (every transition and offset in range) and held for match_trie. */
typedef struct {
    PyObject_HEAD
    Py_buffer views[6];
    int held;
    int have_dups;
    Index ix;
    Py_ssize_t index_nodes;
} Tables;

static void Tables_dealloc(Tables *self) {
    for (int i = 0; i < self->held; i++) {
        PyBuffer_Release(&self->views[i]);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Tables_init(Tables *self, PyObject *args, PyObject *kwds) {
    PyObject *objs[6];
    long long dense_nodes;
    int shift;
    if (self->held) {
        PyErr_SetString(PyExc_RuntimeError, "Tables is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OLOiOOOO", &objs[0], &dense_nodes, &objs[1], &shift, &objs[2], &objs[3], &objs[4],
                          &objs[5])) {
        return -1;
    }
    static const Py_ssize_t sizes[6] = {4, 8, 4, 1, 8, 4};
    static const char *names[6] = {"dense", "hash_table", "first_token", "has_children", "dup_offsets", "dup_tokens"};
    self->have_dups = objs[4] != Py_None && objs[5] != Py_None;
    for (int i = 0; i < (self->have_dups ? 6 : 4); i++) {
        if (get_array(objs[i], &self->views[i], sizes[i], names[i]) < 0) {
            return -1;
        }
        self->held = i + 1;
    }
    Py_ssize_t index_nodes = self->views[2].shape[0] - 1, table_size = self->views[1].shape[0];
    if (index_nodes < 1 || self->views[3].shape[0] != index_nodes + 1 || dense_nodes < 0 ||
        dense_nodes > index_nodes || dense_nodes * 256 != self->views[0].shape[0] || table_size < 1 ||
        (table_size & (table_size - 1)) != 0 || shift < 1 || shift > 63 || index_nodes >= INT32_MAX ||
        (self->have_dups && self->views[4].shape[0] != index_nodes + 2)) {
        PyErr_SetString(PyExc_ValueError, "Tables: inconsistent arrays");
        return -1;
    }
    const int32_t *dense = (const int32_t *)self->views[0].buf;
    for (Py_ssize_t i = 0; i < self->views[0].shape[0]; i++) {
        if (dense[i] < 0 || dense[i] > index_nodes) {
            PyErr_SetString(PyExc_ValueError, "Tables: transition out of range");
            return -1;
        }
    }
    const uint64_t *slots = (const uint64_t *)self->views[1].buf;
    int empty = 0;
    for (Py_ssize_t i = 0; i < table_size; i++) {
        if (slots[i] == UINT64_MAX) {
            empty = 1;
        } else if ((int64_t)(slots[i] & 0xFFFFFFFFULL) > index_nodes) {
            PyErr_SetString(PyExc_ValueError, "Tables: transition out of range");
            return -1;
        }
    }
    if (!empty) { /* a full table would make a miss probe forever */
        PyErr_SetString(PyExc_ValueError, "Tables: the hash table has no empty slot");
        return -1;
    }
    if (self->have_dups) {
        const int64_t *off = (const int64_t *)self->views[4].buf;
        for (Py_ssize_t i = 0; i < index_nodes + 2; i++) {
            if (off[i] < 0 || off[i] > self->views[5].shape[0] || (i > 0 && off[i] < off[i - 1])) {
                PyErr_SetString(PyExc_ValueError, "Tables: duplicate offsets out of range");
                return -1;
            }
        }
    }
    self->ix = (Index){dense, dense_nodes, slots, (uint64_t)table_size - 1, shift, (int32_t)index_nodes};
    self->index_nodes = index_nodes;
    return 0;
}

static PyTypeObject TablesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask._native.Tables",
    .tp_basicsize = sizeof(Tables),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A token index's transition tables, checked once, for match_trie.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Tables_init,
    .tp_dealloc = (destructor)Tables_dealloc,
};

/* match_trie(tables, parent, byte, terminal, eos_ids, max_edges)
 *   -> (edge_offsets int32[n + 2], edge_tokens int32, edge_dests int32) as bytearrays, or None
 *      as soon as the edges pass max_edges (>= 0; -1: no limit), before the large allocations
 *
 * The compiler's token matching (see _compile._match) for a trie: for every node m, walk
 * up from m while the path is a suffix of some token, and emit a --token--> m; then the
 * EOS edges of the terminals; then the CSR by source with tokens ascending. */
static PyObject *match_trie(PyObject *module, PyObject *args) {
    PyObject *tables_obj, *objs[4];
    long long max_edges = -1;
    if (!PyArg_ParseTuple(args, "O!OOOO|L", &TablesType, &tables_obj, &objs[0], &objs[1], &objs[2], &objs[3],
                          &max_edges)) {
        return NULL;
    }
    Tables *tables = (Tables *)tables_obj;
    if (!tables->held) {
        PyErr_SetString(PyExc_ValueError, "match_trie: uninitialised Tables");
        return NULL;
    }
    Py_buffer parent, byte, terminal, eos;
    Py_buffer *views[4] = {&parent, &byte, &terminal, &eos};
    static const Py_ssize_t sizes[4] = {4, 1, 4, 8};
    static const char *names[4] = {"parent", "byte", "terminal", "eos_ids"};
    int held = 0;
    PyObject *result = NULL, *offsets_out = NULL, *tokens_out = NULL, *dests_out = NULL;
    int64_t *counts = NULL;
    uint64_t *edges = NULL;
    for (int i = 0; i < 4; i++) {
        if (get_array(objs[i], views[i], sizes[i], names[i]) < 0) {
            goto done;
        }
        held = i + 1;
    }
    const Index ix = tables->ix;
    Py_ssize_t n = parent.shape[0], k = terminal.shape[0];
    const int32_t *par = (const int32_t *)parent.buf, *term = (const int32_t *)terminal.buf;
    const uint8_t *bytes = (const uint8_t *)byte.buf;
    const int64_t *eos_ids = (const int64_t *)eos.buf;
    const int32_t *first_token = (const int32_t *)tables->views[2].buf;
    const uint8_t *has_children = (const uint8_t *)tables->views[3].buf;
    const int64_t *dup_off = tables->have_dups ? (const int64_t *)tables->views[4].buf : NULL;
    const int32_t *dup_tok = tables->have_dups ? (const int32_t *)tables->views[5].buf : NULL;
    if (n < 1 || byte.shape[0] != n || n + k >= INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "match_trie: inconsistent arrays");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (par[i] < 0 || par[i] >= n || (i > 0 && par[i] >= i)) {
            PyErr_SetString(PyExc_ValueError, "match_trie: parents must precede their children");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (term[i] < 0 || term[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "match_trie: terminal out of range");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < eos.shape[0]; i++) {
        if (eos_ids[i] < 0 || eos_ids[i] >= INT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "match_trie: EOS id out of range");
            goto done;
        }
    }
    counts = (int64_t *)PyMem_Calloc((size_t)n + 2, sizeof(int64_t));
    if (counts == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* one walk: every (source, token, destination) into a growing buffer, counted by source */
    int64_t total = 0, capacity = 4 * (int64_t)n + (int64_t)k * eos.shape[0] + 16;
    int32_t *found = NULL; /* triples: source, token, destination */
    int failed = 0, over = 0;
    if (max_edges >= 0 && capacity > max_edges + 1) {
        capacity = max_edges + 1; /* the buffer never outgrows the budget */
    }
    Py_BEGIN_ALLOW_THREADS
    found = (int32_t *)malloc((size_t)capacity * 3 * sizeof(int32_t));
    failed = found == NULL;
    for (Py_ssize_t m = 1; !failed && !over && m < n; m++) {
        int32_t a = par[m], u = index_child(&ix, 0, bytes[m]);
        for (;;) {
            if (first_token[u] >= 0) {
                int64_t extra = 1 + (dup_off ? dup_off[u + 1] - dup_off[u] : 0);
                if (max_edges >= 0 && total + extra > max_edges) {
                    over = 1;
                    break;
                }
                if (total + extra > capacity) {
                    capacity = 2 * capacity + extra;
                    if (max_edges >= 0 && capacity > max_edges + 1) {
                        capacity = max_edges + 1; /* still >= total + extra */
                    }
                    int32_t *grown = (int32_t *)realloc(found, (size_t)capacity * 3 * sizeof(int32_t));
                    if (grown == NULL) {
                        failed = 1;
                        break;
                    }
                    found = grown;
                }
                int32_t *t = found + 3 * total;
                t[0] = a, t[1] = first_token[u], t[2] = (int32_t)m;
                total++;
                if (dup_off) {
                    for (int64_t d = dup_off[u]; d < dup_off[u + 1]; d++, total++) {
                        t = found + 3 * total;
                        t[0] = a, t[1] = dup_tok[d], t[2] = (int32_t)m;
                    }
                }
                counts[a] += extra;
            }
            if (!has_children[u] || a == 0) {
                break;
            }
            u = index_child(&ix, u, bytes[a]);
            a = par[a];
        }
    }
    if (!failed && !over) {
        for (Py_ssize_t i = 0; i < k; i++) {
            counts[term[i]] += eos.shape[0];
        }
        total += (int64_t)k * eos.shape[0];
        over = max_edges >= 0 && total > max_edges;
    }
    Py_END_ALLOW_THREADS
    if (failed) {
        free(found);
        PyErr_NoMemory();
        goto done;
    }
    if (over) {
        free(found);
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    if (total >= INT32_MAX) {
        free(found);
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 edges: split the set");
        goto done;
    }
    char *offsets_data = NULL, *tokens_data = NULL, *dests_data = NULL;
    offsets_out = new_bytes((n + 2) * 4, &offsets_data);
    tokens_out = offsets_out ? new_bytes(total * 4, &tokens_data) : NULL;
    dests_out = tokens_out ? new_bytes(total * 4, &dests_data) : NULL;
    edges = dests_out ? (uint64_t *)PyMem_Malloc((size_t)(total > 0 ? total : 1) * sizeof(uint64_t)) : NULL;
    if (edges == NULL) {
        free(found);
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    int32_t *offsets = (int32_t *)offsets_data;
    int32_t *tokens = (int32_t *)tokens_data, *dests = (int32_t *)dests_data;
    Py_BEGIN_ALLOW_THREADS
    /* offsets, then a counting sort of the triples by source (counts becomes the cursor),
       each edge as one key (token << 32 | destination) so that its order is the token's */
    offsets[0] = 0;
    for (Py_ssize_t i = 0; i <= n; i++) {
        offsets[i + 1] = offsets[i] + (int32_t)(i < n ? counts[i] : 0);
        if (i < n) {
            counts[i] = offsets[i];
        }
    }
    int64_t text = total - (int64_t)k * eos.shape[0];
    for (int64_t i = 0; i < text; i++) {
        const int32_t *t = found + 3 * i;
        edges[counts[t[0]]++] = (uint64_t)(uint32_t)t[1] << 32 | (uint32_t)t[2];
    }
    free(found);
    for (Py_ssize_t i = 0; i < k; i++) {
        for (Py_ssize_t e = 0; e < eos.shape[0]; e++) {
            edges[counts[term[i]]++] = (uint64_t)eos_ids[e] << 32 | (uint32_t)(n + i);
        }
    }
    for (Py_ssize_t node = 0; node < n; node++) {
        sort_keys(edges + offsets[node], offsets[node + 1] - offsets[node]);
    }
    for (int64_t i = 0; i < total; i++) {
        tokens[i] = (int32_t)(edges[i] >> 32);
        dests[i] = (int32_t)(edges[i] & 0xFFFFFFFFu);
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(3, offsets_out, tokens_out, dests_out);
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(views[i]);
    }
    PyMem_Free(counts);
    PyMem_Free(edges);
    Py_XDECREF(offsets_out);
    Py_XDECREF(tokens_out);
    Py_XDECREF(dests_out);
    return result;
}

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

/* ------------------------------------------------------------------ matcher */

/* MatcherCore: the per-request state of triemask.Matcher (its base class) and its two
 * per-step methods. The fields are the matcher's _kernel (a Kernel or None), _state,
 * _history (a deque) and _tokens (a list or None); Python code reads and writes them as
 * attributes. A call the kernel does not take (no kernel, a token that is not an exact
 * int, a bitmask it defers) goes to the Python methods _accept_token_reference and
 * _fill_reference, which are the reference implementation. */
typedef struct {
    PyObject_HEAD
    PyObject *kernel;
    long long state;
    PyObject *history;
    PyObject *tokens;
} MatcherCore;

static PyObject *str_append, *str_accept_reference, *str_fill_reference;

static void MatcherCore_dealloc(MatcherCore *self) {
    Py_CLEAR(self->kernel);
    Py_CLEAR(self->history);
    Py_CLEAR(self->tokens);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *defer_to(PyObject *self, PyObject *name, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *method = PyObject_GetAttr(self, name);
    if (method == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(method, args, (size_t)nargs, kwnames);
    Py_DECREF(method);
    return result;
}

static PyObject *MatcherCore_accept_token(MatcherCore *self, PyObject *const *args, Py_ssize_t nargs,
                                          PyObject *kwnames) {
    int64_t token;
    if (kwnames == NULL && nargs != 1) {
        PyErr_Format(PyExc_TypeError, "accept_token() takes 1 argument (token_id), got %zd", nargs);
        return NULL;
    }
    if (kwnames != NULL || self->kernel == NULL || Py_TYPE(self->kernel) != &KernelType ||
        self->history == NULL || !exact_int(args[0], &token) || !valid_state((Kernel *)self->kernel, self->state)) {
        return defer_to((PyObject *)self, str_accept_reference, args, nargs, kwnames);
    }
    int32_t following = next_of((Kernel *)self->kernel, self->state, token);
    if (following == -1) {
        Py_RETURN_FALSE;
    }
    if (following == NO_MEMORY) {
        return PyErr_NoMemory();
    }
    PyObject *previous = PyLong_FromLongLong(self->state);
    if (previous == NULL) {
        return NULL;
    }
    PyObject *done = PyObject_CallMethodOneArg(self->history, str_append, previous);
    Py_DECREF(previous);
    if (done == NULL) {
        return NULL;
    }
    Py_DECREF(done);
    self->state = following;
    if (self->tokens != NULL && self->tokens != Py_None && PyList_Append(self->tokens, args[0]) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

static PyObject *MatcherCore_fill(MatcherCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    int64_t row = 0;
    int done = 0;
    if (nargs >= 1 && nargs <= 2 && kwnames == NULL && self->kernel != NULL && Py_TYPE(self->kernel) == &KernelType &&
        (nargs == 1 || exact_int(args[1], &row)) && valid_state((Kernel *)self->kernel, self->state)) {
        done = fill_into((Kernel *)self->kernel, args[0], row, self->state);
    }
    if (done < 0) {
        return NULL;
    }
    if (!done) {
        PyObject *result = defer_to((PyObject *)self, str_fill_reference, args, nargs, kwnames);
        if (result == NULL) {
            return NULL;
        }
        Py_DECREF(result);
    }
    Py_RETURN_NONE;
}

static PyMethodDef MatcherCore_methods[] = {
    {"accept_token", (PyCFunction)(void (*)(void))MatcherCore_accept_token, METH_FASTCALL | METH_KEYWORDS,
     "accept_token($self, token_id)\n--\n\n"
     "Advance by one token. Returns False, leaving the state unchanged, when the\n"
     "token is not allowed (any integer is accepted as input; none raises)."},
    {"fill_next_token_bitmask", (PyCFunction)(void (*)(void))MatcherCore_fill, METH_FASTCALL | METH_KEYWORDS,
     "fill_next_token_bitmask($self, bitmask, row=0)\n--\n\n"
     "Overwrite row ``row`` of ``bitmask`` with the mask of the next token.\n\n"
     "``bitmask`` is an int32 numpy array or CPU torch tensor of shape\n"
     "``(batch, ceil(vocab_size / 32))`` (or one row of it)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef MatcherCore_members[] = {
    {"_kernel", T_OBJECT, offsetof(MatcherCore, kernel), 0, "the automaton's Kernel, or None"},
    {"_state", T_LONGLONG, offsetof(MatcherCore, state), 0, "the current state"},
    {"_history", T_OBJECT, offsetof(MatcherCore, history), 0, "the previous states (a deque)"},
    {"_tokens", T_OBJECT, offsetof(MatcherCore, tokens), 0, "the accepted tokens (a list), or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MatcherCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask._native.MatcherCore",
    .tp_basicsize = sizeof(MatcherCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The per-request state of triemask.Matcher and its per-step methods in C.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)MatcherCore_dealloc,
    .tp_methods = MatcherCore_methods,
    .tp_members = MatcherCore_members,
};

/* AutomatonCore: the base class of triemask.TrieAutomaton, holding its _kernel (a Kernel
 * or None), with next_state and the one-state fill_bitmask in C; anything else goes to
 * the Python methods _next_state_reference and _fill_bitmask_reference. */
typedef struct {
    PyObject_HEAD
    PyObject *kernel;
} AutomatonCore;

static PyObject *str_next_reference, *str_fill_bitmask_reference, *str_rows;

static void AutomatonCore_dealloc(AutomatonCore *self) {
    Py_CLEAR(self->kernel);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *AutomatonCore_next_state(AutomatonCore *self, PyObject *const *args, Py_ssize_t nargs,
                                          PyObject *kwnames) {
    int64_t state, token;
    if (kwnames == NULL && nargs != 2) {
        PyErr_Format(PyExc_TypeError, "next_state() takes 2 arguments (state, token_id), got %zd", nargs);
        return NULL;
    }
    if (kwnames != NULL || self->kernel == NULL || Py_TYPE(self->kernel) != &KernelType ||
        !exact_int(args[0], &state) || !exact_int(args[1], &token) || !valid_state((Kernel *)self->kernel, state)) {
        return defer_to((PyObject *)self, str_next_reference, args, nargs, kwnames);
    }
    int32_t following = next_of((Kernel *)self->kernel, state, token);
    return following == NO_MEMORY ? PyErr_NoMemory() : PyLong_FromLong(following);
}

static PyObject *AutomatonCore_fill_bitmask(AutomatonCore *self, PyObject *const *args, Py_ssize_t nargs,
                                            PyObject *kwnames) {
    /* the per-step call: fill_bitmask(bitmask, [state]) or (bitmask, (state,)), rows None */
    int64_t state;
    int no_rows = kwnames == NULL ||
                  (PyTuple_GET_SIZE(kwnames) == 1 && args[nargs] == Py_None &&
                   PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), str_rows) == 0);
    if (nargs == 2 && no_rows && self->kernel != NULL && Py_TYPE(self->kernel) == &KernelType &&
        (PyList_CheckExact(args[1]) || PyTuple_CheckExact(args[1])) && PySequence_Fast_GET_SIZE(args[1]) == 1 &&
        exact_int(PySequence_Fast_ITEMS(args[1])[0], &state) && valid_state((Kernel *)self->kernel, state)) {
        int done = fill_into((Kernel *)self->kernel, args[0], 0, state);
        if (done < 0) {
            return NULL;
        }
        if (done) {
            Py_RETURN_NONE;
        }
    }
    PyObject *result = defer_to((PyObject *)self, str_fill_bitmask_reference, args, nargs, kwnames);
    if (result == NULL) {
        return NULL;
    }
    Py_DECREF(result);
    Py_RETURN_NONE;
}

static PyMethodDef AutomatonCore_methods[] = {
    {"next_state", (PyCFunction)(void (*)(void))AutomatonCore_next_state, METH_FASTCALL | METH_KEYWORDS,
     "next_state($self, state, token_id)\n--\n\n"
     "The state after ``token_id``; :data:`DEAD` when the token is not allowed."},
    {"fill_bitmask", (PyCFunction)(void (*)(void))AutomatonCore_fill_bitmask, METH_FASTCALL | METH_KEYWORDS,
     "fill_bitmask($self, bitmask, states, *, rows=None)\n--\n\n"
     "Write the allowed-token masks of a batch of states into ``bitmask``, in place.\n\n"
     "Parameters\n----------\n"
     "bitmask : numpy array or CPU torch tensor\n"
     "    ``int32`` of shape ``(batch, ceil(vocab_size / 32))``, C-contiguous; bit\n"
     "    ``i % 32`` of word ``i // 32`` is set iff token ``i`` is allowed. Every\n"
     "    written row is overwritten entirely.\n"
     "states : sequence of int\n"
     "    One state per row to write.\n"
     "rows : sequence of int, optional\n"
     "    The rows to write, one per state (distinct); default ``0 .. len(states) - 1``.\n"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef AutomatonCore_members[] = {
    {"_kernel", T_OBJECT, offsetof(AutomatonCore, kernel), 0, "the automaton's Kernel, or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AutomatonCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask._native.AutomatonCore",
    .tp_basicsize = sizeof(AutomatonCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The base of triemask.TrieAutomaton: its per-step methods in C.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)AutomatonCore_dealloc,
    .tp_methods = AutomatonCore_methods,
    .tp_members = AutomatonCore_members,
};

/* pairs(states) -> (rows int64, tokens int32) as bytearrays: every allowed (row, token) of
 * a batch of states (allowed_token_pairs), or None to defer. */
static PyObject *Kernel_pairs(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    Ints states;
    if (nargs != 1 || !get_ints(args[0], &states)) {
        Py_RETURN_NONE;
    }
    const int64_t *s = states.data;
    int64_t total = 0;
    Edges e;
    for (Py_ssize_t i = 0; i < states.size; i++) {
        if (!valid_state(self, s[i])) {
            release_ints(&states);
            Py_RETURN_NONE;
        }
        if (s[i] >= 0 && s[i] < self->num_nodes) {
            if (node_edges(self, s[i], &e) < 0) {
                release_ints(&states);
                return PyErr_NoMemory();
            }
            total += e.count;
        }
    }
    char *rows_data, *tokens_data;
    PyObject *result = NULL, *tokens_out = NULL, *rows_out = new_bytes(total * 8, &rows_data);
    if (rows_out != NULL) {
        tokens_out = new_bytes(total * 4, &tokens_data);
    }
    if (rows_out != NULL && tokens_out != NULL) {
        int64_t *rows = (int64_t *)rows_data;
        int32_t *tokens = (int32_t *)tokens_data;
        int failed = 0;
        PyThreadState *saved = self->lazy ? NULL : PyEval_SaveThread(); /* the lazy cache needs the GIL */
        int64_t at = 0;
        for (Py_ssize_t i = 0; i < states.size && !failed; i++) {
            if (s[i] >= 0 && s[i] < self->num_nodes) {
                /* a lazy node evicted since the count is rebuilt: the same edges again */
                failed = node_edges(self, s[i], &e) < 0;
                if (!failed) {
                    memcpy(tokens + at, e.tokens, (size_t)e.count * sizeof(int32_t));
                    for (int32_t k = 0; k < e.count; k++) {
                        rows[at++] = i;
                    }
                }
            }
        }
        if (saved) {
            PyEval_RestoreThread(saved);
        }
        result = failed ? PyErr_NoMemory() : PyTuple_Pack(2, rows_out, tokens_out);
    }
    release_ints(&states);
    Py_XDECREF(rows_out);
    Py_XDECREF(tokens_out);
    return result;
}

/* ------------------------------------------------------------------ lazy kernels */

/* lazy_kernel(node_byte u8, node_word u16, child_blocks i32, terminal_blocks i32,
 *             terminal_values i32, tok_children i32, tok_byte u8, tok_offsets i32, tok_ids i32,
 *             eos_ids i32, num_nodes, num_states, width, dense_min, cache_bytes) -> Kernel
 * Every array is checked here (counts against the samples, children after their parent,
 * ids in range), so that no lookup can leave them whatever they hold. */
static PyObject *lazy_kernel(PyObject *module, PyObject *args) {
    PyObject *objs[10];
    long long num_nodes, num_states, dense_min, cache_bytes;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOLLnLL", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5],
                          &objs[6], &objs[7], &objs[8], &objs[9], &num_nodes, &num_states, &width, &dense_min,
                          &cache_bytes)) {
        return NULL;
    }
    static const Py_ssize_t sizes[10] = {1, 2, 4, 4, 4, 4, 1, 4, 4, 4};
    static const char *names[10] = {"node_byte",    "node_word", "child_blocks", "terminal_blocks", "terminal_values",
                                    "tok_children", "tok_byte",  "tok_offsets",  "tok_ids",         "eos_ids"};
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
    Py_buffer eos;
    for (int i = 0; i < 10; i++) {
        if (get_array(objs[i], i < 9 ? &z->views[i] : &eos, sizes[i], names[i]) < 0) {
            Py_DECREF(self);
            return NULL;
        }
        if (i < 9) {
            z->held = i + 1;
        }
    }
    z->node_byte = (const uint8_t *)z->views[0].buf;
    z->node_word = (const uint16_t *)z->views[1].buf;
    z->child_blocks = (const int32_t *)z->views[2].buf;
    z->terminal_blocks = (const int32_t *)z->views[3].buf;
    z->terminal_values = (const int32_t *)z->views[4].buf;
    z->tok_children = (const int32_t *)z->views[5].buf;
    z->tok_byte = (const uint8_t *)z->views[6].buf;
    z->tok_offsets = (const int32_t *)z->views[7].buf;
    z->tok_ids = (const int32_t *)z->views[8].buf;
    Py_ssize_t n = z->views[0].shape[0], blocks = (n + 63) / 64, nt = z->views[6].shape[0];
    Py_ssize_t values = z->views[4].shape[0], n_ids = z->views[8].shape[0];
    uint64_t limit = 32 * (uint64_t)width; /* a token's bit lies in the row */
    int bad = n < 1 || n != num_nodes || width < 1 || width > ((int64_t)1 << 26) || dense_min < 1 ||
              cache_bytes < 0 || num_states != num_nodes + values || n >= INT32_MAX - values ||
              z->views[1].shape[0] != n || z->views[2].shape[0] != blocks + 1 ||
              z->views[3].shape[0] != blocks + 1 || nt < 1 || z->views[5].shape[0] != nt + 1 ||
              z->views[7].shape[0] != nt + 1;
    int64_t first = 1, terminals = 0;
    for (Py_ssize_t a = 0; !bad && a < n; a++) {
        if (a % 64 == 0) {
            bad |= z->child_blocks[a / 64] != first || z->terminal_blocks[a / 64] != terminals;
        }
        int64_t count = z->node_word[a] & LAZY_COUNT;
        bad |= count > 256 || (count > 0 && (first <= a || first + count > n));
        first += count;
        terminals += (z->node_word[a] & LAZY_TERMINAL) != 0;
    }
    bad |= bad || first != n || z->child_blocks[blocks] != n || terminals != values ||
           z->terminal_blocks[blocks] != values;
    for (Py_ssize_t i = 0; !bad && i < values; i++) {
        bad |= z->terminal_values[i] < 0 || z->terminal_values[i] >= values;
    }
    bad |= bad || z->tok_offsets[0] != 0 || z->tok_offsets[nt] != n_ids || z->tok_children[0] < 1;
    for (Py_ssize_t u = 0; !bad && u < nt; u++) {
        int32_t lo = z->tok_children[u], hi = z->tok_children[u + 1];
        bad |= hi < lo || hi > nt || (hi > lo && lo <= u) || z->tok_offsets[u + 1] < z->tok_offsets[u];
    }
    for (Py_ssize_t i = 0; !bad && i < n_ids; i++) {
        bad |= (uint64_t)(uint32_t)z->tok_ids[i] >= limit;
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
    if (node_edges(self, node, &e) < 0) {
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
    if (z == NULL || nargs != 1 || !exact_int(args[0], &node) || node < 0 || node >= self->num_nodes) {
        Py_RETURN_NONE;
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

/* cache_clear(): drop every cached row (counters kept) */
static PyObject *Kernel_cache_clear(Kernel *self, PyObject *unused) {
    Lazy *z = self->lazy;
    while (z != NULL && z->oldest != NULL) {
        lazy_evict_oldest(z);
        z->evictions--; /* a clear is not an eviction */
    }
    Py_RETURN_NONE;
}

/* checksum(buffer) -> int: the file format's checksum of a run of bytes (see
 * triemask._storage.checksum, the NumPy reference): the bytes as little-endian 64-bit words
 * (the last one padded with zeros), each word i mixed by a bijection of (word + (i + 1) * K1),
 * the results summed and the sum mixed with the length. A changed word always changes its
 * term, so any corruption inside one word is caught; the GIL is released, so pieces of a
 * file are checked on every core. */
#define CHECK_K1 0x9E3779B97F4A7C15ull
#define CHECK_K2 0xBF58476D1CE4E5B9ull
#define CHECK_K3 0x94D049BB133111EBull

static inline uint64_t check_term(uint64_t word, uint64_t salt) {
    uint64_t x = word + salt;
    x ^= x >> 31;
    x *= CHECK_K2;
    return x ^ (x >> 29);
}

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t w;
    memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    return w;
}

static PyObject *checksum(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf;
    uint64_t n = (uint64_t)view.len, words = n / 8;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, i = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; i + 4 <= words; i += 4) { /* four independent sums: the multiplies overlap */
        s0 += check_term(load_le64(p + 8 * i), (i + 1) * CHECK_K1);
        s1 += check_term(load_le64(p + 8 * i + 8), (i + 2) * CHECK_K1);
        s2 += check_term(load_le64(p + 8 * i + 16), (i + 3) * CHECK_K1);
        s3 += check_term(load_le64(p + 8 * i + 24), (i + 4) * CHECK_K1);
    }
    for (; i < words; i++) {
        s0 += check_term(load_le64(p + 8 * i), (i + 1) * CHECK_K1);
    }
    if (n % 8) {
        unsigned char last[8] = {0};
        memcpy(last, p + 8 * words, n % 8);
        s0 += check_term(load_le64(last), (words + 1) * CHECK_K1);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    uint64_t h = s0 + s1 + s2 + s3 + n;
    h ^= h >> 33;
    h *= CHECK_K3;
    h ^= h >> 33;
    return PyLong_FromUnsignedLongLong(h);
}

/* spelled_edges(parent, byte, edge_offsets, edge_tokens, edge_dests, token_lengths, token_offsets,
 *               data, terminal, eos)
 * -> the index of the first edge whose token does not spell the path it takes (walking up from
 * its destination, one byte a step, must end at its source; an edge to final state n + v must
 * leave value v's node by an EOS token), or -1 when every one does (see
 * _automaton._check_edges_spell_values). Every index is checked before it is read, whatever the
 * arrays hold; the GIL is released. */
static PyObject *spelled_edges(PyObject *module, PyObject *args) {
    PyObject *objs[10];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &objs[6],
                          &objs[7], &objs[8], &objs[9])) {
        return NULL;
    }
    static const Py_ssize_t sizes[10] = {4, 1, 4, 4, 4, 4, 8, 1, 4, 4};
    static const char *names[10] = {"parent",      "byte",          "edge_offsets", "edge_tokens", "edge_dests",
                                    "token_lengths", "token_offsets", "data",         "terminal",    "eos"};
    Py_buffer views[10];
    int held = 0;
    PyObject *result = NULL;
    for (; held < 10; held++) {
        if (get_array(objs[held], &views[held], sizes[held], names[held]) < 0) {
            goto done;
        }
    }
    const int32_t *parent = (const int32_t *)views[0].buf, *eo = (const int32_t *)views[2].buf;
    const uint8_t *byte = (const uint8_t *)views[1].buf, *data = (const uint8_t *)views[7].buf;
    const int32_t *tokens = (const int32_t *)views[3].buf, *dests = (const int32_t *)views[4].buf;
    const int32_t *lengths = (const int32_t *)views[5].buf;
    const int64_t *offsets = (const int64_t *)views[6].buf;
    const int32_t *terminal = (const int32_t *)views[8].buf, *eos = (const int32_t *)views[9].buf;
    Py_ssize_t n = views[0].shape[0], edges = views[3].shape[0], n_tokens = views[5].shape[0];
    Py_ssize_t n_data = views[7].shape[0], n_values = views[8].shape[0], n_eos = views[9].shape[0];
    if (views[1].shape[0] != n || views[2].shape[0] != n + 2 || views[4].shape[0] != edges ||
        views[6].shape[0] < n_tokens) {
        PyErr_SetString(PyExc_ValueError, "spelled_edges: arrays of inconsistent lengths");
        goto done;
    }
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 1; i < n && bad < 0; i++) { /* breadth-first: a parent comes first */
        if (parent[i] < 0 || parent[i] >= i) {
            bad = -2;
        }
    }
    for (Py_ssize_t node = 0; node < n && bad == -1; node++) {
        int32_t lo = eo[node], hi = eo[node + 1];
        if (lo < 0 || hi < lo || hi > edges) {
            bad = lo < 0 || lo > edges ? 0 : lo;
            break;
        }
        for (int32_t e = lo; e < hi; e++) {
            int32_t m = dests[e], t = tokens[e];
            if (m < 0) {
                bad = e;
                break;
            }
            if (m >= n) { /* a final state: EOS after the value ending here */
                int is_eos = 0;
                for (Py_ssize_t j = 0; j < n_eos; j++) {
                    is_eos |= eos[j] == t;
                }
                if (m - n >= n_values || terminal[m - n] != node || !is_eos) {
                    bad = e;
                    break;
                }
                continue;
            }
            if (t < 0 || t >= n_tokens || lengths[t] <= 0 || offsets[t] < 0 || offsets[t] + lengths[t] > n_data) {
                bad = e;
                break;
            }
            int64_t at = m;
            for (int64_t k = lengths[t] - 1; k >= 0; k--) {
                if (at <= 0 || byte[at] != data[offsets[t] + k]) {
                    at = -1;
                    break;
                }
                at = parent[at];
            }
            if (at != node) {
                bad = e;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (bad == -2) {
        PyErr_SetString(PyExc_ValueError, "spelled_edges: a parent that is not before its node");
        goto done;
    }
    result = PyLong_FromSsize_t(bad);
done:
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
    }
    return result;
}

static PyMethodDef module_methods[] = {
    {"enable_ndarray_headers", enable_ndarray_headers, METH_VARARGS,
     "Check the mirror of NumPy's array header on three probes; read headers directly if it holds."},
    {"match_trie", match_trie, METH_VARARGS, "Token matching and edge CSR of a trie (see _compile._match)."},
    {"build_trie", build_trie, METH_VARARGS, "The breadth-first trie of a set of byte strings (see _trie.build_trie)."},
    {"build_hash", build_hash, METH_VARARGS, "The token index's open-addressing table (see _token_index._build_hash)."},
    {"lazy_kernel", lazy_kernel, METH_VARARGS, "A Kernel over a lazy automaton's arrays (see triemask._lazy)."},
    {"checksum", checksum, METH_O, "The file format's checksum of a buffer (see triemask._storage.checksum)."},
    {"spelled_edges", spelled_edges, METH_VARARGS,
     "The first edge whose token does not spell its path, or -1 (see _automaton.first_misspelled_edge)."},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef Kernel_methods[] = {
    {"next", (PyCFunction)(void (*)(void))Kernel_next, METH_FASTCALL,
     "next(state, token) -> next state (-1: not allowed), or None to defer to Python's checks"},
    {"fill", (PyCFunction)(void (*)(void))Kernel_fill, METH_FASTCALL,
     "fill(bitmask, row, state) -> True, or None to defer to Python's checks"},
    {"fill_batch", (PyCFunction)(void (*)(void))Kernel_fill_batch, METH_FASTCALL,
     "fill_batch(bitmask, states, rows_or_None) -> True, or None to defer (lists of ints or int64 arrays)"},
    {"next_batch", (PyCFunction)(void (*)(void))Kernel_next_batch, METH_FASTCALL,
     "next_batch(states, tokens, out_int32) -> True, or None to defer (lists of ints or int64 arrays)"},
    {"pairs", (PyCFunction)(void (*)(void))Kernel_pairs, METH_FASTCALL,
     "pairs(states) -> (rows int64, tokens int32) bytearrays of every allowed pair, or None to defer"},
    {"edges", (PyCFunction)(void (*)(void))Kernel_edges, METH_FASTCALL,
     "edges(node) -> (tokens int32, dests int32) bytearrays of one node's edges, or None to defer"},
    {"spell", (PyCFunction)(void (*)(void))Kernel_spell, METH_FASTCALL,
     "spell(node) -> the bytes of a lazy trie's node, or None to defer"},
    {"cache_info", (PyCFunction)Kernel_cache_info, METH_NOARGS, "The lazy cache's counters (None when eager)."},
    {"cache_clear", (PyCFunction)Kernel_cache_clear, METH_NOARGS, "Drop the lazy cache's rows."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask._native.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Read-only views of one automaton's arrays, with the per-step and batch loops.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Kernel_init,
    .tp_dealloc = (destructor)Kernel_dealloc,
    .tp_methods = Kernel_methods,
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "triemask._native",
    "C loops for triemask's per-step, batch and compile paths (the NumPy code is the reference).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&KernelType) < 0 || PyType_Ready(&TablesType) < 0 || PyType_Ready(&MatcherCoreType) < 0 ||
        PyType_Ready(&AutomatonCoreType) < 0) {
        return NULL;
    }
    str_next_reference = PyUnicode_InternFromString("_next_state_reference");
    str_fill_bitmask_reference = PyUnicode_InternFromString("_fill_bitmask_reference");
    str_rows = PyUnicode_InternFromString("rows");
    if (str_next_reference == NULL || str_fill_bitmask_reference == NULL || str_rows == NULL) {
        return NULL;
    }
    str_append = PyUnicode_InternFromString("append");
    str_accept_reference = PyUnicode_InternFromString("_accept_token_reference");
    str_fill_reference = PyUnicode_InternFromString("_fill_reference");
    if (str_append == NULL || str_accept_reference == NULL || str_fill_reference == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&native_module);
    if (module == NULL) {
        return NULL;
    }
    Py_INCREF(&KernelType);
    if (PyModule_AddObject(module, "Kernel", (PyObject *)&KernelType) < 0) {
        Py_DECREF(&KernelType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&MatcherCoreType);
    if (PyModule_AddObject(module, "MatcherCore", (PyObject *)&MatcherCoreType) < 0) {
        Py_DECREF(&MatcherCoreType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&AutomatonCoreType);
    if (PyModule_AddObject(module, "AutomatonCore", (PyObject *)&AutomatonCoreType) < 0) {
        Py_DECREF(&AutomatonCoreType);
        Py_DECREF(module);
        return NULL;
    }
    Py_INCREF(&TablesType);
    if (PyModule_AddObject(module, "Tables", (PyObject *)&TablesType) < 0) {
        Py_DECREF(&TablesType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
