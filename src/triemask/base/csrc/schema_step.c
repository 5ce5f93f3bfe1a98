/* ------------------------------------------------------------------ schema steps */

/* The common steps of a mixed schema (triemask.schemas), in C. Most steps have one
 * configuration, and it is one of two kinds:
 *
 *   in the JSON structure that xgrammar follows, with a token that cannot enter an enum field
 *   (every step of a schema without trie fields): accept is the JSON lexer's table lookup
 *   (strict JSON) and xgrammar's accept_token; fill is xgrammar's fill into the caller's row
 *   (or the scratch row, where the extra tokens of structural prefixes do not fit in the
 *   model's padding ids), then, for each extra token set (a field may follow that prefix),
 *   engine._fill_entries: each field whose sentinel xgrammar takes after the prefix (then
 *   rolled back) adds its entering tokens; then the lexer's keep row ANDed in;
 *   inside a field's value: accept is the lexer's lookup and one trie step, to a node inside
 *   the value or (where a value's end resumes the structure on the same matcher: not a tool's
 *   name) to a leaf, where the value is over; at a node from which a value may end inside a
 *   token, for a token that cannot (no exit's head) or that ends it (below). Fill is the
 *   trie's row (the set kernel's fill_one); at such a node (where a value's end resumes the
 *   structure on the same matcher) plus the tokens that end the value and go on:
 *   engine._exit_tokens, from xgrammar's mask after the value and, for a rest that mask cannot
 *   decide, engine._feasible's probe (the rest taken whole, else no field can be entered inside
 *   it), then the lexer's row. Where the value switches schemas (a tool's name, a union's
 *   discriminator), the tokens that end it are those its schema keeps (engine._switch_exits, a
 *   row's words and their bits, read through one call), then the lexer's row.
 *
 * Two steps cross a value's boundary, where the token has one reading (engine._feed, without
 * its forks): a token that may enter a field, read whole by the structure (the common step) or
 * entering one field at one place, at a trie node inside the value, xgrammar's matcher taking the
 * bytes before the value and the field's sentinel in place; and a token that ends the value at
 * one exit and goes on at no trie node, the matcher taking the rest in place (no value may start
 * in it). Rollback undoes both with xgrammar's own rollback, as the common step's.
 *
 * xgrammar is called through the handle of its GrammarMatcher (matcher._handle), the cheapest
 * interface it offers: no Python frame of its wrapper. Everything else (a token holding a
 * whole value, or with several readings: the structure's and a field's, two fields', a value
 * that ends or goes on; a field that may be entered inside a rest; a tool's name, whose end
 * moves to its arguments' grammar; a buffer other than a C-contiguous int32 ndarray of the row
 * width; an argument that is not an exact int) goes to the Python methods
 * _accept_token_reference and _fill_reference of SchemaMatcher, the reference implementation,
 * which tests/test_schema_native.py compares this against at every step of random walks.
 *
 * LexTables: a vocabulary's part, built once per vocabulary and checked here once:
 *
 *   tokens        tuple, by token id < n: the token's bytes, or None (special tokens); the
 *                 steps read `after` and the bytes from one record per token (TokenStep)
 *   after         uint8 [LEX_STATES * n]: the lexer state after token t from state s, at
 *                 s * n + t (LEX_STATES: refused)
 *   keep          int32 [2 * LEX_STATES * width]: two sets of rows, one per lexer state: the
 *                 bitmask of tokens not refused inside strings (outside them xgrammar's JSON
 *                 structure holds no byte the lexer refuses but a sentinel's lead (0xFF,
 *                 0x01), which stays refused, and its free text begins no character with a
 *                 byte that begins none:
 *                 Lexical.string_keep), then the same less the refusals of a raw control
 *                 character inside a string (Lexical.utf8_keep: for grammars that admit none
 *                 there, structure.controls_in_strings)
 *   sparse_*      the same rows as CSR (offsets int64 [2 * LEX_STATES + 1], words and masks
 *                 int32): the words where a row is not all ones, ANDed one by one where they
 *                 are few (of Qwen's 4,748 words, outside strings 332 in the first set and 1
 *                 in the second; between a string's characters 2,014 and none)
 *   eos           uint8 [vocab_size]: 1 for the end-of-sequence ids
 *   pseudo_keep   int32 [pseudo_hi - pseudo_lo]: in xgrammar's words pseudo_lo .. pseudo_hi,
 *                 the bits of real tokens (the others are the extra tokens)
 *
 * StepTables: one compiled schema's part: its LexTables; which set of keep rows its grammar
 * needs (`controls_in_strings`); the bytes its values start with (`starts_first`); `crossing`
 * (uint8 [n]: 1 where the token may enter one of its fields); per field its Kernel, flags
 * (uint8 by trie node: FIELD_LEAF | FIELD_ACCEPTING | FIELD_EXITS, the last where a value may
 * end inside a token) and Exits (fields.exit_tables: used only where every field has them);
 * the field entries by structural prefix (fields.entry_tables) and the first extra token's id;
 * and `plain_exits`: whether a value's end resumes the structure on the same matcher (not so
 * for a tool's name, after which its arguments' grammar takes over).
 *
 * SchemaCore: the base class of SchemaMatcher, holding its per-request fields as attributes
 * (_schema, _configs, _history, _output, _lexer, _filled, _scratch, _scratch_width), which the
 * Python code reads and writes as before. What the current configurations are is looked up
 * when _configs is another list than at the last call, and kept. A step inside a value makes
 * no list (nor a configuration, nor an int): the matcher keeps the node, its history the
 * configuration and the node, and the list is made where Python reads _configs or a step.
 */

enum { LEX_STATES = 10, KEEP_ROWS = 2 * LEX_STATES, STRUCT_FIELD = -1 };

/* What a step reads of a token, in one 32-byte record (one cache line's read, where the lexer's
 * table, the tokens' tuple and the bytes object were three): the lexer state after it from each
 * state, and its bytes where they fit (`length`: their count, else TEXT_LONG: the tuple's bytes,
 * TEXT_NONE: no bytes (special tokens), TEXT_OTHER: an item that is no bytes: the reference). */
enum { TEXT_INLINE = 21, TEXT_OTHER = 253, TEXT_NONE = 254, TEXT_LONG = 255 };
typedef struct {
    uint8_t after[LEX_STATES];
    uint8_t length;
    char text[TEXT_INLINE];
} TokenStep;
typedef char token_step_fills_32_bytes[sizeof(TokenStep) == 32 ? 1 : -1];
enum { FIELD_LEAF = 1, FIELD_ACCEPTING = 2, FIELD_EXITS = 4 }; /* a field node's flags */

typedef struct {
    PyObject_HEAD
    PyObject *tokens; /* tuple */
    Py_buffer after, keep, eos, pseudo_keep, sparse_offsets, sparse_words, sparse_masks;
    TokenStep *steps;    /* by token id < n, in `steps_memory` (aligned to a cache line) */
    void *steps_memory;
    Py_ssize_t n, vocab_size, width, xgr_width, pseudo_lo, pseudo_hi;
    int inline_pseudo;
    int sparse[KEEP_ROWS]; /* whether a row is ANDed word by word from the CSR */
} LexTables;

static void release_views(Py_buffer *views, size_t count) {
    for (size_t i = 0; i < count; i++) {
        if (views[i].obj != NULL) {
            PyBuffer_Release(&views[i]);
        }
    }
}

static void LexTables_dealloc(LexTables *self) {
    Py_buffer views[] = {self->after,       self->keep,           self->eos,         self->pseudo_keep,
                         self->sparse_offsets, self->sparse_words, self->sparse_masks};
    release_views(views, sizeof(views) / sizeof(views[0]));
    PyMem_Free(self->steps_memory);
    Py_CLEAR(self->tokens);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int LexTables_init(LexTables *self, PyObject *args, PyObject *kwds) {
    PyObject *tokens, *after, *keep, *eos, *pseudo_keep, *sparse_offsets, *sparse_words, *sparse_masks;
    Py_ssize_t vocab_size, xgr_width, pseudo_lo, pseudo_hi;
    int inline_pseudo;
    static char *names[] = {"tokens",       "after",        "keep",       "eos",       "pseudo_keep",
                            "sparse_offsets", "sparse_words", "sparse_masks", "vocab_size", "xgr_width",
                            "pseudo_lo",    "pseudo_hi",    "inline_pseudo", NULL};
    if (self->tokens != NULL) {
        PyErr_SetString(PyExc_TypeError, "LexTables are built once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOOOOOOnnnnp", names, &PyTuple_Type, &tokens, &after, &keep,
                                     &eos, &pseudo_keep, &sparse_offsets, &sparse_words, &sparse_masks, &vocab_size,
                                     &xgr_width, &pseudo_lo, &pseudo_hi, &inline_pseudo)) {
        return -1;
    }
    PyObject *sources[] = {after, keep, eos, pseudo_keep, sparse_offsets, sparse_words, sparse_masks};
    Py_buffer *views[] = {&self->after,          &self->keep,         &self->eos,         &self->pseudo_keep,
                          &self->sparse_offsets, &self->sparse_words, &self->sparse_masks};
    for (size_t i = 0; i < sizeof(views) / sizeof(views[0]); i++) {
        if (PyObject_GetBuffer(sources[i], views[i], PyBUF_C_CONTIGUOUS) < 0) {
            return -1;
        }
    }
    Py_ssize_t n = PyTuple_GET_SIZE(tokens), width = (vocab_size + 31) / 32;
    int bad = vocab_size < 1 || n > vocab_size || self->after.len != LEX_STATES * n ||
              self->keep.len != (Py_ssize_t)sizeof(int32_t) * KEEP_ROWS * width || self->eos.len != vocab_size ||
              pseudo_lo < 0 || pseudo_hi < pseudo_lo || pseudo_hi > xgr_width ||
              self->pseudo_keep.len != (Py_ssize_t)sizeof(int32_t) * (pseudo_hi - pseudo_lo) ||
              (inline_pseudo ? xgr_width != width : (xgr_width <= width || pseudo_lo < width));
    const uint8_t *states = (const uint8_t *)self->after.buf;
    for (Py_ssize_t i = 0; !bad && i < self->after.len; i++) {
        bad = states[i] > LEX_STATES;
    }
    /* the CSR: offsets ascending from 0 to the words' count, words in [0, width) */
    const int64_t *offsets = (const int64_t *)self->sparse_offsets.buf;
    const int32_t *words = (const int32_t *)self->sparse_words.buf;
    Py_ssize_t count = self->sparse_words.len / (Py_ssize_t)sizeof(int32_t);
    bad |= self->sparse_offsets.len != (Py_ssize_t)sizeof(int64_t) * (KEEP_ROWS + 1) ||
           self->sparse_masks.len != self->sparse_words.len || self->sparse_words.len % sizeof(int32_t) != 0;
    for (int r = 0; !bad && r < KEEP_ROWS; r++) {
        bad = offsets[0] != 0 || offsets[r + 1] < offsets[r] || offsets[KEEP_ROWS] != count;
        self->sparse[r] = !bad && 8 * (offsets[r + 1] - offsets[r]) <= width;
    }
    for (Py_ssize_t i = 0; !bad && i < count; i++) {
        bad = words[i] < 0 || words[i] >= width;
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "schema step tables of inconsistent sizes or lexer states out of range");
        return -1;
    }
    self->steps_memory = PyMem_Malloc((size_t)n * sizeof(TokenStep) + 64);
    if (self->steps_memory == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->steps = (TokenStep *)(((uintptr_t)self->steps_memory + 63) & ~(uintptr_t)63);
    for (Py_ssize_t t = 0; t < n; t++) {
        TokenStep *step = &self->steps[t];
        PyObject *data = PyTuple_GET_ITEM(tokens, t);
        for (int s = 0; s < LEX_STATES; s++) {
            step->after[s] = states[s * n + t];
        }
        step->length = data == Py_None              ? TEXT_NONE
                       : !PyBytes_CheckExact(data)    ? TEXT_OTHER
                       : PyBytes_GET_SIZE(data) > TEXT_INLINE ? TEXT_LONG
                                                              : (uint8_t)PyBytes_GET_SIZE(data);
        if (step->length <= TEXT_INLINE) {
            memcpy(step->text, PyBytes_AS_STRING(data), step->length);
        }
    }
    Py_INCREF(tokens);
    self->tokens = tokens;
    self->n = n;
    self->vocab_size = vocab_size;
    self->width = width;
    self->xgr_width = xgr_width;
    self->pseudo_lo = pseudo_lo;
    self->pseudo_hi = pseudo_hi;
    self->inline_pseudo = inline_pseudo;
    return 0;
}

static PyTypeObject LexTablesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask.base._native.LexTables",
    .tp_basicsize = sizeof(LexTables),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A vocabulary's tables for the C steps of mixed schemas (see schema_step.c).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)LexTables_init,
    .tp_dealloc = (destructor)LexTables_dealloc,
};

/* A field's ends of values inside a token (fields.Field's exit_* and its Pieces' head_*): the
 * exits by trie node (ascending), each the piece that ends a value there; per piece, the heads:
 * tokens that begin with it, where it ends in them, and three lookups in xgrammar's vocabulary
 * (the rest as one token, its longest token prefix, the extra token of the one place a value
 * could start again in it: -1 unknown, -2 none); the field's first bytes and its sentinel; and
 * where a value begins inside a token, its tails and middles (dicts: a piece's bytes to a trie
 * node, checked where read) and its last bytes. */
enum { EXIT_VIEWS = 6, EXIT_ITEMS = EXIT_VIEWS + 5 };
typedef struct {
    Py_buffer views[EXIT_VIEWS]; /* exit_nodes, exit_pieces, head_offsets, head_tokens, head_ends, head_lookups */
    const int32_t *nodes, *pieces, *ends;
    const int64_t *offsets, *tokens, *lookups;
    Py_ssize_t n_exits, n_heads;
    PyObject *first, *sentinel, *tails, *middles, *last; /* bytes and dicts, borrowed from the fields tuple */
} Exits;

/* Where a field may be entered after a structural prefix (engine._fill_entries): the field, the
 * prefix's bytes and its sentinel (what xgrammar must take for it), the words and bits of the
 * tokens that enter it there, and whether some token holds a whole value there and goes on
 * (middles: the reference reads those). */
typedef struct {
    Py_ssize_t field;
    PyObject *text; /* bytes, borrowed from the entries tuple */
    Py_buffer words, bits; /* int64, int32 */
    Py_ssize_t count;
    int middles;
} FieldEntry;

typedef struct {
    PyObject_HEAD
    LexTables *lex;
    Py_buffer crossing;
    PyObject *fields;        /* tuple of (Kernel, flags, exits or None) */
    Py_ssize_t n_fields;
    Kernel **kernels;        /* borrowed from `fields` */
    Py_buffer *flags;        /* one per field: uint8 by node */
    Exits *exits;            /* one per field, NULL where every field has none */
    PyObject *starts_first;  /* bytes: every field's first bytes */
    PyObject *entries_given; /* tuple, by prefix id, of tuples of (field, text, words, bits, middles) */
    FieldEntry *entries;     /* flat, by prefix id: entry_offsets[p] .. entry_offsets[p + 1] */
    Py_ssize_t *entry_offsets, n_entries, n_prefixes, first_pseudo;
    int plain_exits;         /* a value's end resumes the structure on the same matcher */
    int keep_rows;           /* the first of the lexer's keep rows the grammar needs */
} StepTables;

static Py_ssize_t xgr_bits(const LexTables *l) { return 32 * l->xgr_width; }

/* Fill `x` from a field's exits tuple (exit_nodes int32, exit_pieces int32, head_offsets int64,
 * head_tokens int64, head_ends int32, head_lookups int64 [3 * heads], first bytes, sentinel
 * bytes), every index checked: 1, 0 when inconsistent, -1 on an error. */
static int Exits_init(Exits *x, PyObject *given, const LexTables *l, int64_t num_nodes, Py_ssize_t bits) {
    if (!PyTuple_Check(given) || PyTuple_GET_SIZE(given) != EXIT_ITEMS ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(given, EXIT_VIEWS)) ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(given, EXIT_VIEWS + 1)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(given, EXIT_VIEWS + 2)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(given, EXIT_VIEWS + 3)) ||
        !PyBytes_CheckExact(PyTuple_GET_ITEM(given, EXIT_VIEWS + 4))) {
        return 0;
    }
    for (int v = 0; v < EXIT_VIEWS; v++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(given, v), &x->views[v], PyBUF_C_CONTIGUOUS) < 0) {
            return -1;
        }
    }
    x->nodes = (const int32_t *)x->views[0].buf;
    x->pieces = (const int32_t *)x->views[1].buf;
    x->offsets = (const int64_t *)x->views[2].buf;
    x->tokens = (const int64_t *)x->views[3].buf;
    x->ends = (const int32_t *)x->views[4].buf;
    x->lookups = (const int64_t *)x->views[5].buf;
    x->first = PyTuple_GET_ITEM(given, EXIT_VIEWS);
    x->sentinel = PyTuple_GET_ITEM(given, EXIT_VIEWS + 1);
    x->tails = PyTuple_GET_ITEM(given, EXIT_VIEWS + 2);
    x->middles = PyTuple_GET_ITEM(given, EXIT_VIEWS + 3);
    x->last = PyTuple_GET_ITEM(given, EXIT_VIEWS + 4);
    x->n_exits = x->views[0].len / (Py_ssize_t)sizeof(int32_t);
    x->n_heads = x->views[3].len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t n_pieces = x->views[2].len / (Py_ssize_t)sizeof(int64_t) - 1;
    int bad = x->views[0].len % sizeof(int32_t) != 0 || x->views[1].len != x->views[0].len || n_pieces < 0 ||
              x->views[2].len % sizeof(int64_t) != 0 || x->views[3].len % sizeof(int64_t) != 0 ||
              x->views[4].len != x->n_heads * (Py_ssize_t)sizeof(int32_t) ||
              x->views[5].len != 3 * x->n_heads * (Py_ssize_t)sizeof(int64_t);
    for (Py_ssize_t e = 0; !bad && e < x->n_exits; e++) {
        bad = x->nodes[e] < 0 || x->nodes[e] >= num_nodes || (e > 0 && x->nodes[e] < x->nodes[e - 1]) ||
              x->pieces[e] < 0 || x->pieces[e] >= n_pieces;
    }
    for (Py_ssize_t p = 0; !bad && p <= n_pieces; p++) {
        bad = x->offsets[p] < 0 || x->offsets[p] > x->n_heads || (p > 0 && x->offsets[p] < x->offsets[p - 1]);
    }
    for (Py_ssize_t h = 0; !bad && h < x->n_heads; h++) {
        PyObject *data = x->tokens[h] >= 0 && x->tokens[h] < l->n ? PyTuple_GET_ITEM(l->tokens, x->tokens[h]) : NULL;
        bad = data == NULL || !PyBytes_CheckExact(data) || x->ends[h] < 0 || x->ends[h] > PyBytes_GET_SIZE(data);
        for (int j = 0; !bad && j < 3; j++) {
            int64_t id = x->lookups[j * x->n_heads + h];
            bad = id < -2 || id >= bits;
        }
    }
    return !bad;
}

static int StepTables_entries(StepTables *self, PyObject *given, Py_ssize_t first_pseudo);

static void StepTables_dealloc(StepTables *self) {
    if (self->crossing.obj != NULL) {
        PyBuffer_Release(&self->crossing);
    }
    if (self->flags != NULL) {
        release_views(self->flags, (size_t)self->n_fields);
    }
    for (Py_ssize_t k = 0; self->exits != NULL && k < self->n_fields; k++) {
        release_views(self->exits[k].views, EXIT_VIEWS);
    }
    PyMem_Free(self->exits);
    for (Py_ssize_t i = 0; self->entries != NULL && i < self->n_entries; i++) {
        Py_buffer views[] = {self->entries[i].words, self->entries[i].bits};
        release_views(views, 2);
    }
    PyMem_Free(self->entries);
    PyMem_Free(self->entry_offsets);
    Py_CLEAR(self->entries_given);
    Py_CLEAR(self->starts_first);
    PyMem_Free(self->flags);
    PyMem_Free(self->kernels);
    Py_CLEAR(self->fields);
    Py_CLEAR(self->lex);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int StepTables_init(StepTables *self, PyObject *args, PyObject *kwds) {
    PyObject *lex, *crossing, *fields;
    int plain_exits = 0, controls = 1;
    PyObject *starts_first = NULL, *entries = NULL;
    Py_ssize_t first_pseudo = 0;
    static char *names[] = {"lex",          "crossing", "fields",       "plain_exits", "controls_in_strings",
                            "starts_first", "entries",  "first_pseudo", NULL};
    if (self->lex != NULL) {
        PyErr_SetString(PyExc_TypeError, "StepTables are built once");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO!|ppO!O!n", names, &LexTablesType, &lex, &crossing,
                                     &PyTuple_Type, &fields, &plain_exits, &controls, &PyBytes_Type, &starts_first,
                                     &PyTuple_Type, &entries, &first_pseudo)) {
        return -1;
    }
    if (PyObject_GetBuffer(crossing, &self->crossing, PyBUF_C_CONTIGUOUS) < 0) {
        return -1;
    }
    const LexTables *l = (const LexTables *)lex;
    Py_ssize_t n_fields = PyTuple_GET_SIZE(fields);
    self->kernels = PyMem_Calloc((size_t)n_fields + 1, sizeof(Kernel *));
    self->flags = PyMem_Calloc((size_t)n_fields + 1, sizeof(Py_buffer));
    if (self->kernels == NULL || self->flags == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->n_fields = n_fields;
    int bad = self->crossing.len != l->n;
    int all_exits = n_fields > 0 && starts_first != NULL;
    for (Py_ssize_t k = 0; !bad && k < n_fields; k++) {
        PyObject *field = PyTuple_GET_ITEM(fields, k);
        if (!PyTuple_Check(field) || PyTuple_GET_SIZE(field) < 2 || PyTuple_GET_SIZE(field) > 3 ||
            Py_TYPE(PyTuple_GET_ITEM(field, 0)) != &KernelType) {
            bad = 1;
            break;
        }
        Kernel *kernel = (Kernel *)PyTuple_GET_ITEM(field, 0);
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(field, 1), &self->flags[k], PyBUF_C_CONTIGUOUS) < 0) {
            return -1;
        }
        /* one flag per node (a final state, reached by an EOS token, has none: it defers) */
        bad = kernel->width != l->width || self->flags[k].len != kernel->num_nodes;
        self->kernels[k] = kernel;
        all_exits &= PyTuple_GET_SIZE(field) == 3 && PyTuple_GET_ITEM(field, 2) != Py_None;
    }
    if (!bad && all_exits) {
        self->exits = PyMem_Calloc((size_t)n_fields, sizeof(Exits));
        if (self->exits == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t k = 0; !bad && k < n_fields; k++) {
            int made = Exits_init(&self->exits[k], PyTuple_GET_ITEM(PyTuple_GET_ITEM(fields, k), 2), l,
                                  self->kernels[k]->num_nodes, xgr_bits(l));
            if (made < 0) {
                return -1;
            }
            bad = !made;
        }
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "schema step tables of inconsistent sizes or lexer states out of range");
        return -1;
    }
    Py_INCREF(lex);
    self->lex = (LexTables *)lex;
    Py_INCREF(fields);
    self->fields = fields;
    self->plain_exits = plain_exits;
    self->keep_rows = controls ? 0 : LEX_STATES;
    Py_XINCREF(starts_first);
    self->starts_first = starts_first;
    if (entries != NULL) {
        int made = StepTables_entries(self, entries, first_pseudo);
        if (made <= 0) {
            if (made == 0) {
                PyErr_SetString(PyExc_ValueError, "schema step tables: inconsistent field entries");
            }
            return -1;
        }
    }
    return 0;
}

/* The field entries by prefix id (the extra token first_pseudo + p stands for prefix p), every
 * index checked: 1, 0 when inconsistent, -1 on an error. */
static int StepTables_entries(StepTables *self, PyObject *given, Py_ssize_t first_pseudo) {
    const LexTables *l = self->lex;
    Py_ssize_t n_prefixes = PyTuple_GET_SIZE(given), total = 0;
    if (first_pseudo < 0 || first_pseudo + n_prefixes > 32 * l->xgr_width) {
        return 0;
    }
    for (Py_ssize_t p = 0; p < n_prefixes; p++) {
        if (!PyTuple_Check(PyTuple_GET_ITEM(given, p))) {
            return 0;
        }
        total += PyTuple_GET_SIZE(PyTuple_GET_ITEM(given, p));
    }
    self->entries = PyMem_Calloc((size_t)total + 1, sizeof(FieldEntry));
    self->entry_offsets = PyMem_Calloc((size_t)n_prefixes + 1, sizeof(Py_ssize_t));
    if (self->entries == NULL || self->entry_offsets == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_INCREF(given);
    self->entries_given = given;
    self->n_prefixes = n_prefixes;
    self->first_pseudo = first_pseudo;
    for (Py_ssize_t p = 0; p < n_prefixes; p++) {
        PyObject *here = PyTuple_GET_ITEM(given, p);
        self->entry_offsets[p] = self->n_entries;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(here); i++) {
            PyObject *item = PyTuple_GET_ITEM(here, i);
            if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 5 || !PyLong_CheckExact(PyTuple_GET_ITEM(item, 0)) ||
                !PyBytes_CheckExact(PyTuple_GET_ITEM(item, 1))) {
                return 0;
            }
            FieldEntry *entry = &self->entries[self->n_entries];
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 2), &entry->words, PyBUF_C_CONTIGUOUS) < 0) {
                return -1;
            }
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, 3), &entry->bits, PyBUF_C_CONTIGUOUS) < 0) {
                PyBuffer_Release(&entry->words);
                return -1;
            }
            self->n_entries++;
            entry->field = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 0));
            entry->text = PyTuple_GET_ITEM(item, 1);
            entry->middles = PyObject_IsTrue(PyTuple_GET_ITEM(item, 4));
            entry->count = entry->bits.len / (Py_ssize_t)sizeof(int32_t);
            if (entry->field < 0 || entry->field >= self->n_fields || entry->middles < 0 ||
                entry->words.len != entry->count * (Py_ssize_t)sizeof(int64_t) ||
                entry->bits.len % (Py_ssize_t)sizeof(int32_t) != 0) {
                PyErr_Clear();
                return 0;
            }
            const int64_t *words = (const int64_t *)entry->words.buf;
            for (Py_ssize_t j = 0; j < entry->count; j++) {
                if (words[j] < 0 || words[j] >= l->width) {
                    return 0;
                }
            }
        }
    }
    self->entry_offsets[n_prefixes] = self->n_entries;
    return 1;
}

static PyMemberDef StepTables_members[] = {
    {"keep_rows", T_INT, offsetof(StepTables, keep_rows), READONLY,
     "the first keep row ANDed: 0 (controls in strings possible), else LEX_STATES"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StepTablesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask.base._native.StepTables",
    .tp_basicsize = sizeof(StepTables),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What the C steps of one mixed schema read (see schema_step.c).",
    .tp_members = StepTables_members,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)StepTables_init,
    .tp_dealloc = (destructor)StepTables_dealloc,
};

/* The first exit of `x` at trie node `node` (exits ascend by node). */
static Py_ssize_t first_exit(const Exits *x, int64_t node) {
    Py_ssize_t e = 0, hi = x->n_exits;
    while (e < hi) {
        Py_ssize_t mid = e + (hi - e) / 2;
        if (x->nodes[mid] < node) {
            e = mid + 1;
        } else {
            hi = mid;
        }
    }
    return e;
}

/* The head of exit `e`'s piece that `token` is (heads ascend by token within a piece, each
 * token once: the piece ends where its length does), or -1. */
static int64_t head_of(const Exits *x, Py_ssize_t e, int64_t token) {
    int64_t lo = x->offsets[x->pieces[e]], hi = x->offsets[x->pieces[e] + 1], end = hi;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (x->tokens[mid] < token) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo < end && x->tokens[lo] == token ? lo : -1;
}

/* Whether `token` begins with a piece that ends a value at `node`: then it may leave the value. */
static int exit_head(const Exits *x, int64_t node, int64_t token) {
    for (Py_ssize_t e = first_exit(x, node); e < x->n_exits && x->nodes[e] == node; e++) {
        if (head_of(x, e, token) >= 0) {
            return 1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------ a schema matcher's history */

/* History: what rollback restores, one step per accepted token, the newest `maxlen` kept (a
 * deque(maxlen=...) of (configurations, output length, lexer state, advanced) tuples, as the
 * Python reference keeps it, has the same methods). The steps are C records in a ring that
 * grows to maxlen: a step appends one without allocating a tuple and an int and freeing the
 * ones maxlen steps older (a step's largest cost with the caches cold, as a serving engine's
 * forward pass leaves them: 2.3 of 14 us); a tuple is made only where Python pops or iterates.
 * Not tracked by the garbage collector, as the tuples were not: nothing a step holds (the
 * configurations, xgrammar's matcher) refers back to the matcher whose history holds it. */
typedef struct {
    PyObject *configs, *advanced; /* owned (advanced: None where the step replaced the configurations) */
    Py_ssize_t length;            /* the output's length before the step */
    long long lexer;              /* the lexer state before it */
    int64_t node; /* -1: `configs` is the list; else it is one configuration, the list [it at trie node `node`] */
} Step;

typedef struct {
    PyObject_HEAD
    Step *ring;
    Py_ssize_t maxlen, capacity, start, size; /* the oldest step at ring[start] */
} History;

static PyTypeObject HistoryType;

/* Append a step (new references taken to configs and advanced; `node`: Step's); the oldest goes
 * past maxlen. 0, or -1 out of memory. */
static int history_push(History *h, PyObject *configs, Py_ssize_t length, long long lexer, PyObject *advanced,
                        int64_t node) {
    if (h->maxlen == 0) {
        return 0;
    }
    if (h->size == h->capacity && h->capacity < h->maxlen) { /* grow, the steps in order from 0 */
        Py_ssize_t capacity = h->capacity < 8 ? 8 : 2 * h->capacity;
        capacity = capacity > h->maxlen ? h->maxlen : capacity;
        Step *grown = (Step *)PyMem_Malloc((size_t)capacity * sizeof(Step));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t i = 0; i < h->size; i++) {
            grown[i] = h->ring[(h->start + i) % h->capacity];
        }
        PyMem_Free(h->ring);
        h->ring = grown, h->capacity = capacity, h->start = 0;
    }
    Step dropped = {NULL, NULL, 0, 0, -1};
    Step *slot;
    if (h->size == h->capacity) { /* full at maxlen: the oldest step's slot is the newest's */
        slot = &h->ring[h->start];
        dropped = *slot;
        h->start = (h->start + 1) % h->capacity;
    } else {
        slot = &h->ring[(h->start + h->size) % h->capacity];
        h->size++;
    }
    Py_INCREF(configs);
    Py_INCREF(advanced);
    *slot = (Step){configs, advanced, length, lexer, node};
    Py_XDECREF(dropped.configs); /* (released last: a deallocation may run any code) */
    Py_XDECREF(dropped.advanced);
    return 0;
}

static PyObject *configs_at(PyObject *config, int64_t node);

/* The step `i` steps after the oldest, as the reference's tuple. */
static PyObject *history_item(const History *h, Py_ssize_t i) {
    const Step *step = &h->ring[(h->start + i) % h->capacity];
    PyObject *length = PyLong_FromSsize_t(step->length), *lexer = PyLong_FromLongLong(step->lexer);
    PyObject *configs = step->node < 0 ? Py_NewRef(step->configs) : configs_at(step->configs, step->node);
    PyObject *item = length && lexer && configs ? PyTuple_Pack(4, configs, length, lexer, step->advanced) : NULL;
    Py_XDECREF(length);
    Py_XDECREF(lexer);
    Py_XDECREF(configs);
    return item;
}

/* Forget the newest step (there is one). */
static void history_drop_newest(History *h) {
    Step step = h->ring[(h->start + h->size - 1) % h->capacity];
    h->size--;
    Py_DECREF(step.configs);
    Py_DECREF(step.advanced);
}

static void history_clear(History *h) {
    while (h->size > 0) {
        history_drop_newest(h);
    }
    h->start = 0;
}

static PyObject *History_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *keywords[] = {"maxlen", NULL};
    Py_ssize_t maxlen;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", keywords, &maxlen)) {
        return NULL;
    }
    if (maxlen < 0) {
        PyErr_Format(PyExc_ValueError, "maxlen must be at least 0, got %zd", maxlen);
        return NULL;
    }
    History *h = (History *)type->tp_alloc(type, 0);
    if (h != NULL) {
        h->maxlen = maxlen;
    }
    return (PyObject *)h;
}

static void History_dealloc(History *h) {
    history_clear(h);
    PyMem_Free(h->ring);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyObject *History_append(History *h, PyObject *entry) {
    Py_ssize_t length;
    long long lexer;
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4) {
        PyErr_SetString(PyExc_TypeError, "a history step is (configurations, output length, lexer state, advanced)");
        return NULL;
    }
    length = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 1));
    lexer = length == -1 && PyErr_Occurred() ? -1 : PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 2));
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (history_push(h, PyTuple_GET_ITEM(entry, 0), length, lexer, PyTuple_GET_ITEM(entry, 3), -1) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *History_pop(History *h, PyObject *unused) {
    if (h->size == 0) {
        PyErr_SetString(PyExc_IndexError, "pop from an empty history");
        return NULL;
    }
    PyObject *item = history_item(h, h->size - 1);
    if (item != NULL) {
        history_drop_newest(h);
    }
    return item;
}

static PyObject *History_clear(History *h, PyObject *unused) {
    history_clear(h);
    Py_RETURN_NONE;
}

static Py_ssize_t History_len(History *h) {
    return h->size;
}

/* iter(history): the steps oldest first, as tuples (a list's iterator over them) */
static PyObject *History_iter(History *h) {
    PyObject *items = PyList_New(h->size);
    for (Py_ssize_t i = 0; items != NULL && i < h->size; i++) {
        PyObject *item = history_item(h, i);
        if (item == NULL) {
            Py_CLEAR(items);
            break;
        }
        PyList_SET_ITEM(items, i, item);
    }
    PyObject *iterator = items == NULL ? NULL : PyObject_GetIter(items);
    Py_XDECREF(items);
    return iterator;
}

static PyObject *History_maxlen(History *h, void *unused) {
    return PyLong_FromSsize_t(h->maxlen);
}

static PyMethodDef History_methods[] = {
    {"append", (PyCFunction)History_append, METH_O, "Append a step (configurations, length, lexer, advanced)."},
    {"pop", (PyCFunction)History_pop, METH_NOARGS, "Remove and return the newest step."},
    {"clear", (PyCFunction)History_clear, METH_NOARGS, "Forget every step."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef History_getset[] = {
    {"maxlen", (getter)History_maxlen, NULL, "How many steps are kept.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods History_sequence = {.sq_length = (lenfunc)History_len};

static PyTypeObject HistoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask.base._native.History",
    .tp_basicsize = sizeof(History),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "History(maxlen): a schema matcher's rollback steps, the newest maxlen kept.",
    .tp_new = History_new,
    .tp_dealloc = (destructor)History_dealloc,
    .tp_methods = History_methods,
    .tp_getset = History_getset,
    .tp_as_sequence = &History_sequence,
    .tp_iter = (getiterfunc)History_iter,
};

typedef struct {
    PyObject_HEAD
    PyObject *schema, *configs, *history, *output, *filled, *scratch;
    long long lexer, scratch_width;
    /* what `resolved` (a strong reference, so that its address names it) is: one structural
     * configuration (its xgrammar matcher and handle), or one inside field `field` at trie
     * node `node` (the configuration, for the next one), with its schema's tables; or neither */
    PyObject *resolved, *handle, *matcher, *config, *tables;
    int kind;
    /* Steps inside a value make no list: `pending` says that the configurations are `config`
     * at trie node `node` alone, and `configs` (still `resolved`) is what they were when the
     * value was resolved; the list is made where Python reads _configs (SchemaCore_configs). */
    int pending;
    Py_ssize_t field;
    int64_t node;
} SchemaCore;

enum { RESOLVED_OTHER = 0, RESOLVED_STRUCT = 1, RESOLVED_ENUM = 2 };

static PyObject *str_handle, *str_step_tables, *str_accept_token, *str_fill_next_token_bitmask, *str_batch_fill;
static PyObject *str_switch_exits;
static PyObject *str_accept_string, *str_rollback;
static PyObject *small_zero, *small_one, *struct_field, *empty_bytes;

/* A method of xgrammar's matcher handle with one argument (rollback(n), accept_string(data,
 * debug_print) with debug_flag: its last argument False). */
static PyObject *call_handle(PyObject *handle, PyObject *name, PyObject *argument, int debug_flag) {
    PyObject *call[] = {handle, argument, Py_False};
    size_t count = debug_flag ? 3 : 2;
    return PyObject_VectorcallMethod(name, call, count | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* Whether the truth of a call's answer is 1, 0; -1 on an error (the answer released). */
static int truth_of(PyObject *answer) {
    if (answer == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    return truth;
}

/* xgrammar's matcher (its handle) undoes the one string or token it took last: 0, or -1 on an
 * error. */
static int roll_back_one(PyObject *handle) {
    PyObject *undone = call_handle(handle, str_rollback, small_one, 0);
    Py_XDECREF(undone);
    return undone == NULL ? -1 : 0;
}


static void SchemaCore_forget(SchemaCore *self) {
    self->pending = 0; /* (a node pending on `resolved`: forgotten with it) */
    Py_CLEAR(self->resolved);
    Py_CLEAR(self->handle);
    Py_CLEAR(self->matcher);
    Py_CLEAR(self->config);
    Py_CLEAR(self->tables);
    self->kind = RESOLVED_OTHER;
}

static void SchemaCore_dealloc(SchemaCore *self) {
    SchemaCore_forget(self);
    Py_CLEAR(self->schema);
    Py_CLEAR(self->configs);
    Py_CLEAR(self->history);
    Py_CLEAR(self->output);
    Py_CLEAR(self->filled);
    Py_CLEAR(self->scratch);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* What the configurations are (RESOLVED_*), looked up when they are another list than at the
 * last call. An error of the lookups is cleared and gives RESOLVED_OTHER: the reference decides. */
static int SchemaCore_resolve(SchemaCore *self) {
    PyObject *configs = self->configs;
    if (configs == NULL || self->lexer < 0 || self->lexer >= LEX_STATES) {
        return RESOLVED_OTHER;
    }
    if (configs == self->resolved) {
        return self->kind;
    }
    SchemaCore_forget(self);
    Py_INCREF(configs);
    self->resolved = configs;
    if (!PyList_CheckExact(configs) || PyList_GET_SIZE(configs) != 1) {
        return RESOLVED_OTHER;
    }
    PyObject *config = PyList_GET_ITEM(configs, 0);
    int64_t field, node;
    if (!PyTuple_Check(config) || PyTuple_GET_SIZE(config) != 6 || !exact_int(PyTuple_GET_ITEM(config, 2), &field) ||
        !exact_int(PyTuple_GET_ITEM(config, 3), &node)) {
        return RESOLVED_OTHER;
    }
    PyObject *tables = PyObject_GetAttr(PyTuple_GET_ITEM(config, 0), str_step_tables);
    if (tables == NULL || Py_TYPE(tables) != &StepTablesType) {
        PyErr_Clear();
        Py_XDECREF(tables);
        return RESOLVED_OTHER;
    }
    const StepTables *t = (const StepTables *)tables;
    if (field == STRUCT_FIELD) {
        PyObject *handle = PyObject_GetAttr(PyTuple_GET_ITEM(config, 1), str_handle);
        if (handle == NULL) {
            PyErr_Clear();
            Py_DECREF(tables);
            return RESOLVED_OTHER;
        }
        self->handle = handle;
        Py_INCREF(PyTuple_GET_ITEM(config, 1));
        self->matcher = PyTuple_GET_ITEM(config, 1);
        self->kind = RESOLVED_STRUCT;
    } else if (field >= 0 && field < t->n_fields && node >= 0 && node < t->kernels[field]->num_nodes) {
        self->field = (Py_ssize_t)field;
        self->node = node;
        Py_INCREF(config);
        self->config = config;
        self->kind = RESOLVED_ENUM;
    } else {
        Py_DECREF(tables);
        return RESOLVED_OTHER;
    }
    self->tables = tables;
    return self->kind;
}

/* out = from & keep over n words (`from` may be `out`). Kept out of line: GCC vectorises
 * it alone (versioned for aliasing), not once inlined into its caller. */
static NOINLINE void and_words(int32_t *out, const int32_t *from, const int32_t *keep, Py_ssize_t n) {
    for (Py_ssize_t w = 0; w < n; w++) {
        out[w] = from[w] & keep[w];
    }
}

/* out = from & the lexer's keep row `row` (`from` may be `out`; word by word where the row
 * changes few words, else one vectorised pass) */
static void and_keep(const LexTables *l, long long row, const int32_t *from, int32_t *out) {
    if (l->sparse[row]) {
        const int64_t *offsets = (const int64_t *)l->sparse_offsets.buf;
        const int32_t *words = (const int32_t *)l->sparse_words.buf, *masks = (const int32_t *)l->sparse_masks.buf;
        if (from != out) {
            memcpy(out, from, sizeof(int32_t) * (size_t)l->width);
        }
        for (int64_t i = offsets[row]; i < offsets[row + 1]; i++) {
            out[words[i]] &= masks[i];
        }
    } else {
        and_words(out, from, (const int32_t *)l->keep.buf + row * l->width, l->width);
    }
}

static int SchemaCore_settle(SchemaCore *self);

/* Append (configurations, output length, lexer state, advanced) to the history, then make
 * the step: configurations `following` (NULL: unchanged), the lexer state, the token's bytes
 * (`text`, `length`). */
static int SchemaCore_step(SchemaCore *self, PyObject *advanced, PyObject *following, long long lexer,
                           const char *text, Py_ssize_t length) {
    if (Py_TYPE(self->history) == &HistoryType) {
        PyObject *before = self->pending ? self->config : self->configs;
        if (history_push((History *)self->history, before, PyByteArray_GET_SIZE(self->output), self->lexer, advanced,
                         self->pending ? self->node : -1) < 0) {
            return -1;
        }
    } else { /* (a deque: the matcher built where History is not) */
        if (self->pending && SchemaCore_settle(self) < 0) {
            return -1;
        }
        PyObject *length = PyLong_FromSsize_t(PyByteArray_GET_SIZE(self->output));
        PyObject *state = PyLong_FromLongLong(self->lexer);
        PyObject *entry = length && state ? PyTuple_Pack(4, self->configs, length, state, advanced) : NULL;
        Py_XDECREF(length);
        Py_XDECREF(state);
        if (entry != NULL) {
            PyObject_GC_UnTrack(entry); /* (no cycle passes through a step: see History) */
        }
        PyObject *done = entry == NULL ? NULL : PyObject_CallMethodOneArg(self->history, str_append, entry);
        Py_XDECREF(entry);
        if (done == NULL) {
            return -1;
        }
        Py_DECREF(done);
    }
    if (length > 0) {
        Py_ssize_t before = PyByteArray_GET_SIZE(self->output), size = before + length;
        /* Doubled where it must grow: PyByteArray_Resize grows by an eighth, a copy every few
         * tokens of a short output (19 over 100 tokens of 1-6 bytes, doubled 7). Resizing up to
         * 2 * size - 1 allocates that much, and down to size keeps it (a bytearray shrinks its
         * buffer only below half of it). */
        if (size + 1 > ((PyByteArrayObject *)self->output)->ob_alloc &&
            PyByteArray_Resize(self->output, 2 * size - 1) < 0) {
            return -1;
        }
        if (PyByteArray_Resize(self->output, size) < 0) {
            return -1;
        }
        memcpy(PyByteArray_AS_STRING(self->output) + before, text, (size_t)length);
    }
    if (following != NULL) {
        if (self->pending) { /* `resolved`'s node is no longer its list's, and the list may come back */
            SchemaCore_forget(self);
        }
        Py_INCREF(following);
        Py_SETREF(self->configs, following);
    }
    self->lexer = lexer;
    Py_INCREF(Py_None);
    Py_SETREF(self->filled, Py_None); /* the state moved: what the last fill found no longer holds */
    return 0;
}

/* A configuration like `config` (a tuple subclass: Configuration) with its items 2 .. 5 (field,
 * node, value start, cache) replaced; NULL items keep `config`'s. Steals `node`. */
static PyObject *config_like(PyObject *config, PyObject *field, PyObject *node, PyObject *value_start,
                             PyObject *cache) {
    PyTypeObject *type = Py_TYPE(config);
    PyObject *made = node == NULL ? NULL : type->tp_alloc(type, 6);
    if (made == NULL) {
        Py_XDECREF(node);
        return NULL;
    }
    PyObject *items[] = {NULL, NULL, field, node, value_start, cache};
    for (Py_ssize_t i = 0; i < 6; i++) {
        PyObject *item = items[i] == NULL ? PyTuple_GET_ITEM(config, i) : items[i];
        if (i != 3) {
            Py_INCREF(item);
        }
        PyTuple_SET_ITEM(made, i, item);
    }
    return made;
}

/* The list [`config` at trie node `node`]. */
static PyObject *configs_at(PyObject *config, int64_t node) {
    PyObject *moved = config_like(config, NULL, PyLong_FromLongLong(node), NULL, NULL);
    PyObject *configs = moved == NULL ? NULL : PyList_New(1);
    if (configs == NULL) {
        Py_XDECREF(moved);
        return NULL;
    }
    PyList_SET_ITEM(configs, 0, moved);
    return configs;
}

/* Make the list of a pending step inside a value (SchemaCore.pending), resolved as it is. */
static int SchemaCore_settle(SchemaCore *self) {
    PyObject *configs = configs_at(self->config, self->node);
    if (configs == NULL) {
        return -1;
    }
    Py_INCREF(configs);
    Py_SETREF(self->resolved, configs);
    Py_INCREF(PyList_GET_ITEM(configs, 0));
    Py_SETREF(self->config, PyList_GET_ITEM(configs, 0));
    Py_SETREF(self->configs, configs);
    self->pending = 0;
    return 0;
}

/* Whether a value of one of the schema's fields may start at s[j] (structure.value_start_offsets
 * with starts_first): s[j] is one of their first bytes, and only JSON whitespace lies between it
 * and a ':', ',' or '[' before it, or s's start. */
static int value_may_start(const StepTables *t, const char *s, Py_ssize_t j) {
    if (memchr(PyBytes_AS_STRING(t->starts_first), s[j], (size_t)PyBytes_GET_SIZE(t->starts_first)) == NULL) {
        return 0;
    }
    while (j > 0 && (s[j - 1] == ' ' || s[j - 1] == '\t' || s[j - 1] == '\n' || s[j - 1] == '\r')) {
        j--;
    }
    return j == 0 || s[j - 1] == ':' || s[j - 1] == ',' || s[j - 1] == '[';
}

/* Roll xgrammar's matcher (its handle) back by the one string it took: after a step that could
 * not be completed (its error already set, and kept). */
static void undo_string(PyObject *handle) {
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    roll_back_one(handle);
    PyErr_Restore(type, value, traceback);
}

/* Make the step to the one configuration [`config` with field `field`, node `node`, value start
 * `value_start` and cache `cache`], xgrammar's matcher `advanced` having taken one string in place
 * (undone here where the step cannot be made). Steals `value_start` and `cache`. 1, or -1. */
static int SchemaCore_step_to(SchemaCore *self, PyObject *config, PyObject *field, int64_t node,
                              PyObject *value_start, PyObject *cache, PyObject *advanced, PyObject *handle,
                              long long lexer, PyObject *data) { /* (data: the token's bytes object) */
    PyObject *moved = value_start == NULL || cache == NULL
                          ? NULL
                          : config_like(config, field, PyLong_FromLongLong(node), value_start, cache);
    PyObject *configs = moved == NULL ? NULL : PyList_New(1);
    Py_XDECREF(value_start);
    Py_XDECREF(cache);
    if (configs == NULL) {
        Py_XDECREF(moved);
        undo_string(handle);
        return -1;
    }
    PyList_SET_ITEM(configs, 0, moved);
    int failed = SchemaCore_step(self, advanced, configs, lexer, PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data));
    Py_DECREF(configs);
    if (failed) {
        undo_string(handle);
        return -1;
    }
    return 1;
}

/* Where a field's value may start in a token (SchemaCore_cross): the offset, the field and the
 * trie node the rest of the token (the tail) reaches. */
typedef struct {
    Py_ssize_t at, field;
    int64_t node;
} FieldStart;

enum { MAX_STARTS = 8 };

/* xgrammar's matcher (`handle`) takes, in place, the token's bytes before `place` and its field's
 * sentinel: 1 taken, 0 not (unchanged), -1 on an error. */
static int take_start(const StepTables *t, PyObject *handle, const char *bytes, const FieldStart *place) {
    PyObject *sentinel = t->exits[place->field].sentinel;
    PyObject *text = PyBytes_FromStringAndSize(NULL, place->at + PyBytes_GET_SIZE(sentinel));
    if (text == NULL) {
        return -1;
    }
    memcpy(PyBytes_AS_STRING(text), bytes, (size_t)place->at);
    memcpy(PyBytes_AS_STRING(text) + place->at, PyBytes_AS_STRING(sentinel), (size_t)PyBytes_GET_SIZE(sentinel));
    int taken = truth_of(call_handle(handle, str_accept_string, text, 1));
    Py_DECREF(text);
    return taken;
}

/* Where fields' values may start in a token (engine._feed's readings: each offset a value may
 * start at, each field whose values may start with that byte, the node the tail reaches): their
 * count, or -2 where the reference must read the token (a whole value inside it, a tail at a node
 * where a value may be over, too many), -1 on an error. An offset and field without a tail is
 * none. */
static int token_starts(const StepTables *t, const char *bytes, Py_ssize_t length, FieldStart *starts) {
    int count = 0;
    for (Py_ssize_t j = 0; j < length; j++) {
        if (!value_may_start(t, bytes, j)) {
            continue;
        }
        for (Py_ssize_t k = 0; k < t->n_fields; k++) {
            const Exits *x = &t->exits[k];
            if (memchr(PyBytes_AS_STRING(x->first), bytes[j], (size_t)PyBytes_GET_SIZE(x->first)) == NULL) {
                continue;
            }
            const char *piece = bytes + j, *last = PyBytes_AS_STRING(x->last);
            Py_ssize_t size = length - j;
            /* a whole value's end inside the piece (structure.value_end_offsets), then its tail */
            for (Py_ssize_t i = 1; i <= size; i++) {
                if (i < size && (piece[i] == 0 || strchr(",}] \t\n\r", piece[i]) == NULL ||
                                 memchr(last, piece[i - 1], (size_t)PyBytes_GET_SIZE(x->last)) == NULL)) {
                    continue;
                }
                PyObject *key = PyBytes_FromStringAndSize(piece, i);
                PyObject *found = key == NULL ? NULL : PyDict_GetItemWithError(i < size ? x->middles : x->tails, key);
                Py_XDECREF(key);
                int64_t node;
                if (found == NULL) {
                    if (PyErr_Occurred()) {
                        return -1;
                    }
                    continue;
                }
                if (i < size || count == MAX_STARTS || !exact_int(found, &node) || node < 0 ||
                    node >= t->kernels[k]->num_nodes ||
                    ((const uint8_t *)t->flags[k].buf)[node] & (FIELD_LEAF | FIELD_ACCEPTING)) {
                    return -2;
                }
                starts[count++] = (FieldStart){j, k, node};
            }
        }
    }
    return count;
}

/* engine._feed for a token that may enter a field, from one structural configuration, without
 * its forks, where the token has one reading: the structure alone (xgrammar takes its bytes: the
 * common step) or one place (token_starts) whose sentinel xgrammar takes, in place (rollback
 * undoes it, as the common step's): the configuration is then the field's at the place's node.
 * Each place is tried on the matcher itself, undone where another is tried after it. Several
 * readings, or anything token_starts leaves to the reference: deferred. 1 accepted, 0 refused,
 * 2 to defer, -1 on an error. */
static int SchemaCore_cross(SchemaCore *self, PyObject *data, long long lexer) {
    const StepTables *t = (const StepTables *)self->tables;
    if (t->exits == NULL) {
        return 2;
    }
    const char *bytes = PyBytes_AS_STRING(data);
    FieldStart starts[MAX_STARTS];
    int count = token_starts(t, bytes, PyBytes_GET_SIZE(data), starts);
    if (count < 0) {
        return count == -1 ? -1 : 2;
    }
    int whole = truth_of(call_handle(self->handle, str_accept_string, data, 1));
    if (whole < 0) {
        return -1;
    }
    int found = -1, several = whole && count > 0; /* (read whole and maybe entered too) */
    for (int i = 0; !whole && i < count; i++) {
        int taken = take_start(t, self->handle, bytes, &starts[i]);
        if (taken <= 0) {
            if (taken < 0) {
                return -1;
            }
            continue;
        }
        if (found >= 0) {
            several = 1;
            break;
        }
        found = i;
        if (i < count - 1 && roll_back_one(self->handle) < 0) { /* (the next ones: from the token's start) */
            return -1;
        }
    }
    if (several) { /* (the reading taken last undone: the reference reads them all) */
        return roll_back_one(self->handle) < 0 ? -1 : 2;
    }
    if (whole) {
        if (SchemaCore_step(self, self->matcher, NULL, lexer, bytes, PyBytes_GET_SIZE(data)) < 0) {
            undo_string(self->handle);
            return -1;
        }
        return 1;
    }
    if (found < 0) {
        return 0;
    }
    if (found < count - 1) { /* (undone to try the others: taken again) */
        int taken = take_start(t, self->handle, bytes, &starts[found]);
        if (taken <= 0) {
            return taken < 0 ? -1 : 2;
        }
    }
    const FieldStart *place = &starts[found];
    /* the value starts after the output and the token's bytes before it */
    Py_ssize_t before = PyByteArray_GET_SIZE(self->output);
    PyObject *value_start = PyBytes_FromStringAndSize(NULL, before + place->at);
    if (value_start != NULL) {
        memcpy(PyBytes_AS_STRING(value_start), PyByteArray_AS_STRING(self->output), (size_t)before);
        memcpy(PyBytes_AS_STRING(value_start) + before, bytes, (size_t)place->at);
    }
    PyObject *number = PyLong_FromSsize_t(place->field);
    if (number == NULL) {
        Py_XDECREF(value_start);
        undo_string(self->handle);
        return -1;
    }
    int made = SchemaCore_step_to(self, PyList_GET_ITEM(self->resolved, 0), number, place->node, value_start,
                                  PyDict_New(), self->matcher, self->handle, lexer, data);
    Py_DECREF(number);
    return made;
}

/* engine._token for a token that ends the value and nothing else (it goes on at no trie node),
 * where a value's end resumes the structure on the same matcher: one exit's head at the node, and
 * a rest in which no value may start, which xgrammar's matcher takes in place (rollback undoes
 * it), the configuration the structure's. 1 accepted, 0 refused, 2 to defer, -1 on an error. */
static int SchemaCore_leave(SchemaCore *self, int64_t token, PyObject *data, long long lexer) {
    const StepTables *t = (const StepTables *)self->tables;
    if (t->exits == NULL || !t->plain_exits) {
        return 2;
    }
    const Exits *x = &t->exits[self->field];
    int64_t end = -1;
    for (Py_ssize_t e = first_exit(x, self->node); e < x->n_exits && x->nodes[e] == self->node; e++) {
        int64_t h = head_of(x, e, token);
        if (h >= 0 && end >= 0) {
            return 2; /* (several heads: several readings) */
        }
        end = h >= 0 ? x->ends[h] : end;
    }
    if (end < 0) {
        return 2;
    }
    const char *rest = PyBytes_AS_STRING(data) + end;
    Py_ssize_t size = PyBytes_GET_SIZE(data) - end;
    for (Py_ssize_t j = 0; j < size; j++) {
        if (value_may_start(t, rest, j)) {
            return 2;
        }
    }
    PyObject *matcher = PyTuple_GET_ITEM(self->config, 1);
    PyObject *handle = PyObject_GetAttr(matcher, str_handle);
    PyObject *text = handle == NULL ? NULL : PyBytes_FromStringAndSize(rest, size);
    int taken = text == NULL ? -1 : truth_of(call_handle(handle, str_accept_string, text, 1));
    Py_XDECREF(text);
    int made = taken <= 0 ? taken
                          : SchemaCore_step_to(self, self->config, struct_field, 0, Py_NewRef(empty_bytes),
                                               Py_NewRef(Py_None), matcher, handle, lexer, data);
    Py_XDECREF(handle);
    return made;
}

static PyObject *SchemaCore_accept_token(SchemaCore *self, PyObject *const *args, Py_ssize_t nargs,
                                         PyObject *kwnames) {
    int64_t token;
    if (kwnames == NULL && nargs != 1) {
        PyErr_Format(PyExc_TypeError, "accept_token() takes 1 argument (token_id), got %zd", nargs);
        return NULL;
    }
    int kind = RESOLVED_OTHER;
    if (kwnames == NULL && exact_int(args[0], &token) && self->history != NULL && self->output != NULL &&
        PyByteArray_CheckExact(self->output)) {
        kind = SchemaCore_resolve(self);
    }
    if (kind == RESOLVED_OTHER) {
        return defer_to((PyObject *)self, str_accept_reference, args, nargs, kwnames);
    }
    const StepTables *t = (const StepTables *)self->tables;
    const LexTables *l = t->lex;
    if (token < 0 || token >= l->vocab_size) {
        Py_RETURN_FALSE;
    }
    const TokenStep *step = token < l->n ? &l->steps[token] : NULL;
    int length = step == NULL ? TEXT_NONE : step->length;
    long long lexer = self->lexer;
    if (length == TEXT_OTHER) {
        return defer_to((PyObject *)self, str_accept_reference, args, nargs, kwnames);
    }
    if (length != TEXT_NONE) {
        lexer = step->after[self->lexer];
        if (lexer == LEX_STATES) {
            Py_RETURN_FALSE;
        }
    } else if (kind == RESOLVED_ENUM || !((const uint8_t *)l->eos.buf)[token]) {
        Py_RETURN_FALSE; /* no bytes: EOS ends the structure only, nothing else is a token */
    }
    /* the token's bytes: the record's, or the tuple's where they do not fit (the steps across a
     * value's boundary read the tuple's bytes object too) */
    PyObject *data = length == TEXT_LONG ? PyTuple_GET_ITEM(l->tokens, token) : NULL;
    const char *text = length <= TEXT_INLINE ? step->text : data != NULL ? PyBytes_AS_STRING(data) : "";
    Py_ssize_t size = length <= TEXT_INLINE ? length : data != NULL ? PyBytes_GET_SIZE(data) : 0;
    if (kind == RESOLVED_ENUM) {
        /* one trie step inside the value; where a value may end here or next (exits, a leaf
         * or an accepting node), the reference follows every reading */
        const Kernel *kernel = t->kernels[self->field];
        const uint8_t *flags = (const uint8_t *)t->flags[self->field].buf;
        int leaves = flags[self->node] & FIELD_EXITS &&
                     (t->exits == NULL || exit_head(&t->exits[self->field], self->node, token));
        int32_t following = next_of(kernel, self->node, token);
        if (following == NO_MEMORY) {
            return PyErr_NoMemory();
        }
        if (leaves) { /* (a token that also goes on inside the value: several readings) */
            int left = following < 0 ? SchemaCore_leave(self, token, PyTuple_GET_ITEM(l->tokens, token), lexer) : 2;
            return left == 2 ? defer_to((PyObject *)self, str_accept_reference, args, nargs, kwnames)
                             : left < 0 ? NULL : PyBool_FromLong(left);
        }
        if (following < 0) {
            Py_RETURN_FALSE;
        }
        if (following >= kernel->num_nodes) {
            return defer_to((PyObject *)self, str_accept_reference, args, nargs, kwnames);
        }
        if (!(flags[following] & (FIELD_LEAF | FIELD_ACCEPTING))) {
            /* still inside the value: the configurations are this one at the next node, made
             * as a list only where Python reads them (the field and the tables unchanged) */
            if (SchemaCore_step(self, Py_None, NULL, lexer, text, size) < 0) {
                return NULL;
            }
            self->pending = 1;
            self->node = following;
            Py_RETURN_TRUE;
        }
        if (!(flags[following] & FIELD_LEAF && t->plain_exits)) {
            /* a value that may end or go on (several readings), or a tool's arguments */
            return defer_to((PyObject *)self, str_accept_reference, args, nargs, kwnames);
        }
        /* the value is over: the structure resumes on its matcher, already past the sentinel */
        PyObject *config = config_like(self->config, struct_field, PyLong_FromLong(0), empty_bytes, Py_None);
        PyObject *configs = config == NULL ? NULL : PyList_New(1);
        if (configs == NULL) {
            Py_XDECREF(config);
            return NULL;
        }
        PyList_SET_ITEM(configs, 0, config);
        int failed = SchemaCore_step(self, Py_None, configs, lexer, text, size);
        Py_DECREF(configs);
        if (failed) {
            return NULL;
        }
        Py_RETURN_TRUE;
    }
    /* a token that may enter a field needs every reading, unless the last fill found that no
     * field can be entered from these configurations */
    /* (the fill's verdict first: it is the matcher's own field, where the table by token is a
     * read out of the caches, a step's, after a forward pass) */
    if (self->filled != self->configs && length != TEXT_NONE && ((const uint8_t *)t->crossing.buf)[token]) {
        int crossed = SchemaCore_cross(self, PyTuple_GET_ITEM(l->tokens, token), lexer);
        return crossed == 2 ? defer_to((PyObject *)self, str_accept_reference, args, nargs, kwnames)
                            : crossed < 0 ? NULL : PyBool_FromLong(crossed);
    }
    PyObject *call[] = {self->handle, args[0], Py_False};
    PyObject *accepted = PyObject_VectorcallMethod(str_accept_token, call, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (accepted == NULL) {
        return NULL;
    }
    int ok = PyObject_IsTrue(accepted);
    Py_DECREF(accepted);
    if (ok <= 0) {
        return ok < 0 ? NULL : (Py_INCREF(Py_False), Py_False);
    }
    /* xgrammar's matcher advanced in place: rollback undoes it with xgrammar's own rollback */
    if (SchemaCore_step(self, self->matcher, NULL, lexer, text, size) < 0) {
        return NULL;
    }
    Py_RETURN_TRUE;
}

/* engine._fill_entries for structural prefix `prefix` (set in xgrammar's row `xgr`): for each field
 * that may follow it, whether xgrammar takes the prefix and the field's sentinel (then rolled
 * back), and if so its entering tokens ORed into `xgr`. 1 some field can be entered, -2 none,
 * 0 to defer (no tables; a token that holds a whole value there), -1 on an error. */
static int SchemaCore_enter(SchemaCore *self, int32_t *xgr, Py_ssize_t prefix) {
    const StepTables *t = (const StepTables *)self->tables;
    if (t->entries == NULL || prefix < 0 || prefix >= t->n_prefixes) {
        return t->entries == NULL ? 0 : -2; /* (an extra token past the prefixes: none, as the reference) */
    }
    int entered = -2;
    for (Py_ssize_t i = t->entry_offsets[prefix]; i < t->entry_offsets[prefix + 1]; i++) {
        const FieldEntry *entry = &t->entries[i];
        int taken = truth_of(call_handle(self->handle, str_accept_string, entry->text, 1));
        if (taken <= 0) {
            if (taken < 0) {
                return -1;
            }
            continue;
        }
        if (roll_back_one(self->handle) < 0) {
            return -1;
        }
        if (entry->middles) {
            return 0;
        }
        entered = 1;
        const int64_t *words = (const int64_t *)entry->words.buf;
        const int32_t *bits = (const int32_t *)entry->bits.buf;
        for (Py_ssize_t j = 0; j < entry->count; j++) {
            xgr[words[j]] |= bits[j];
        }
    }
    return entered;
}

/* What follows xgrammar's fill of a structural row (`xgr`, xgrammar's words): 0 to defer when
 * an extra token's bit is set (a field may be entered: the reference fills the row again),
 * else the row `out` written (xgrammar's words with the lexer's keep row) and 1. */
static int SchemaCore_finish_row(SchemaCore *self, int32_t *xgr, int32_t *out) {
    const StepTables *t = (const StepTables *)self->tables;
    const LexTables *l = t->lex;
    const int32_t *pseudo_keep = (const int32_t *)l->pseudo_keep.buf;
    int entered = 0;
    for (Py_ssize_t w = l->pseudo_lo; w < l->pseudo_hi; w++) {
        uint32_t bits = (uint32_t)(xgr[w] & ~pseudo_keep[w - l->pseudo_lo]);
        for (; bits != 0; bits &= bits - 1) {
            int bit = 0;
            while (!((bits >> bit) & 1u)) {
                bit++;
            }
            int found = SchemaCore_enter(self, xgr, 32 * w + bit - t->first_pseudo);
            if (found <= 0 && found != -2) {
                return found; /* (0: defer; -1: an error) */
            }
            entered |= found == 1;
        }
        xgr[w] &= pseudo_keep[w - l->pseudo_lo]; /* (the extra tokens are no tokens of the model) */
    }
    and_keep(l, t->keep_rows + self->lexer, xgr, out);
    PyObject *filled = entered ? Py_None : self->configs;
    if (self->filled != filled) { /* (unchanged since the last fill: the list is not touched) */
        Py_INCREF(filled);
        /* where no field can be entered from these configurations, accept_token needs xgrammar only */
        Py_SETREF(self->filled, filled);
    }
    return 1;
}

/* The structural fill into `out` (width words); 1 done, 0 to defer, -1 on an error.
 * `bitmask`, `row`: the caller's. */
static int SchemaCore_fill_structural(SchemaCore *self, PyObject *bitmask, PyObject *row, int32_t *out) {
    const LexTables *l = ((const StepTables *)self->tables)->lex;
    int32_t *xgr = out;
    PyObject *target = bitmask, *index = row;
    if (!l->inline_pseudo) {
        const ArrayHeader *s = (const ArrayHeader *)self->scratch;
        if (self->scratch == NULL || Py_TYPE(self->scratch) != ndarray_type || s->descr != int32_descr ||
            s->nd != 2 || !(s->flags & ARRAY_C_CONTIGUOUS) || !(s->flags & ARRAY_WRITEABLE) ||
            s->dimensions[0] < 1 || s->dimensions[1] != l->xgr_width) {
            return 0;
        }
        target = self->scratch;
        index = small_zero;
        xgr = (int32_t *)s->data;
    }
    PyObject *call[] = {self->handle, target, index, Py_False};
    PyObject *result =
        PyObject_VectorcallMethod(str_fill_next_token_bitmask, call, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (result == NULL) {
        return -1;
    }
    Py_DECREF(result);
    return SchemaCore_finish_row(self, xgr, out);
}

/* engine._feasible for a rest of a token after a value's end, on the structure's matcher past
 * the value (`handle`): 1 the structure takes the rest; 0 it does not and no field can be entered
 * inside it; 2 a field may be entered inside it (the reference reads on: the caller defers);
 * -1 on an error. A value may start inside the rest where its byte is one of starts_first and
 * only JSON whitespace lies between it and a ':', ',' or '[' before it, or the rest's start
 * (structure.value_start_offsets); a field is entered there if the structure takes the rest up
 * to it and the field's sentinel. Each is tried on the matcher itself and undone (a string it
 * refuses leaves it unchanged), where the reference forks. */
static int exit_probe(const StepTables *t, PyObject *handle, const char *rest, Py_ssize_t length) {
    PyObject *whole = PyBytes_FromStringAndSize(rest, length);
    int taken = whole == NULL ? -1 : truth_of(call_handle(handle, str_accept_string, whole, 1));
    Py_XDECREF(whole);
    if (taken != 0) {
        return taken < 0 || roll_back_one(handle) < 0 ? -1 : 1;
    }
    for (Py_ssize_t j = 0; j < length; j++) {
        if (!value_may_start(t, rest, j)) {
            continue;
        }
        for (Py_ssize_t k = 0; k < t->n_fields; k++) {
            const Exits *x = &t->exits[k];
            if (memchr(PyBytes_AS_STRING(x->first), rest[j], (size_t)PyBytes_GET_SIZE(x->first)) == NULL) {
                continue;
            }
            int entered = take_start(t, handle, rest, &(FieldStart){j, k, -1});
            if (entered != 0) {
                return entered < 0 || roll_back_one(handle) < 0 ? -1 : 2;
            }
        }
    }
    return 0;
}

/* engine._exit_tokens for every exit at the current node, added to `out` (the trie's row): the
 * tokens whose head ends the value there and whose rest the structure takes after it, decided
 * by xgrammar's mask after the value (into the matcher's scratch row) and, where that mask
 * cannot tell, a probe. 1 done, 0 to defer (no usable scratch row; a probe that may enter a
 * field), -1 on an error. */
static int SchemaCore_fill_exits(SchemaCore *self, int32_t *out) {
    const StepTables *t = (const StepTables *)self->tables;
    const LexTables *l = t->lex;
    const Exits *x = &t->exits[self->field];
    const ArrayHeader *s = (const ArrayHeader *)self->scratch;
    if (self->scratch == NULL || Py_TYPE(self->scratch) != ndarray_type || s->descr != int32_descr || s->nd != 2 ||
        !(s->flags & ARRAY_C_CONTIGUOUS) || !(s->flags & ARRAY_WRITEABLE) || s->dimensions[0] < 1 ||
        s->dimensions[1] != l->xgr_width) {
        return 0;
    }
    PyObject *handle = PyObject_GetAttr(PyTuple_GET_ITEM(self->config, 1), str_handle);
    if (handle == NULL) {
        return -1;
    }
    int done = -1;
    PyObject *call[] = {handle, self->scratch, small_zero, Py_False};
    PyObject *filled =
        PyObject_VectorcallMethod(str_fill_next_token_bitmask, call, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (filled == NULL) {
        goto done;
    }
    Py_DECREF(filled);
    const int32_t *after = (const int32_t *)s->data;
    Py_ssize_t e = first_exit(x, self->node);
    const int64_t *rests = x->lookups, *prefixes = x->lookups + x->n_heads, *again = x->lookups + 2 * x->n_heads;
#define AFTER_BIT(id) ((id) >= 0 && ((uint32_t)after[(id) >> 5] >> ((id) & 31)) & 1u)
    for (; e < x->n_exits && x->nodes[e] == self->node; e++) {
        for (int64_t h = x->offsets[x->pieces[e]]; h < x->offsets[x->pieces[e] + 1]; h++) {
            int64_t token = x->tokens[h];
            int ok = AFTER_BIT(rests[h]);
            int alone = AFTER_BIT(prefixes[h]) || prefixes[h] < 0;
            int starts = AFTER_BIT(again[h]) || again[h] == -1;
            if (!ok && ((alone && rests[h] < 0) || starts)) {
                PyObject *data = PyTuple_GET_ITEM(l->tokens, token);
                int verdict = exit_probe(t, handle, PyBytes_AS_STRING(data) + x->ends[h],
                                         PyBytes_GET_SIZE(data) - x->ends[h]);
                if (verdict < 0 || verdict == 2) {
                    done = verdict < 0 ? -1 : 0;
                    goto done;
                }
                ok = verdict;
            }
            if (ok) {
                out[token >> 5] |= (int32_t)(1u << (token & 31));
            }
        }
    }
#undef AFTER_BIT
    done = 1;
done:
    Py_DECREF(handle);
    return done;
}

/* engine._switch_exits of the configuration (a value that switches schemas ends at its node),
 * ORed into `out` (the trie's row): 1 done, 0 to defer (None: a field that does not switch, or
 * arrays not as the engine makes them), -1 on an error. */
static int SchemaCore_fill_switch_exits(SchemaCore *self, int32_t *out) {
    PyObject *found = PyObject_CallMethodOneArg(PyTuple_GET_ITEM(self->config, 0), str_switch_exits, self->config);
    if (found == NULL) {
        return -1;
    }
    Py_buffer words = {0}, bits = {0};
    int done = 0;
    if (PyTuple_CheckExact(found) && PyTuple_GET_SIZE(found) == 2 &&
        PyObject_GetBuffer(PyTuple_GET_ITEM(found, 0), &words, PyBUF_C_CONTIGUOUS) == 0) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(found, 1), &bits, PyBUF_C_CONTIGUOUS) == 0) {
            const Py_ssize_t width = ((const StepTables *)self->tables)->lex->width;
            const Py_ssize_t count = bits.len / (Py_ssize_t)sizeof(int32_t);
            const int64_t *w = (const int64_t *)words.buf;
            const int32_t *b = (const int32_t *)bits.buf;
            done = words.itemsize == 8 && bits.itemsize == 4 && words.len == count * (Py_ssize_t)sizeof(int64_t);
            for (Py_ssize_t i = 0; done && i < count; i++) {
                done = w[i] >= 0 && w[i] < width;
            }
            for (Py_ssize_t i = 0; done && i < count; i++) {
                out[w[i]] |= b[i];
            }
            PyBuffer_Release(&bits);
        }
        PyBuffer_Release(&words);
    }
    PyErr_Clear(); /* (a buffer refused: the reference's fill) */
    Py_DECREF(found);
    return done;
}

/* The fill inside a field's value, at a node where no value ends (no exits): the trie's row;
 * 1 done, 0 to defer, -1 on an error. The lexer's keep row is not ANDed in: the trie spells
 * the values' JSON texts from the value's first byte, and each text is strict JSON in UTF-8
 * (control characters escaped, no surrogate, no 0xFF: schemas.reading checks the values and
 * the finite patterns), so the lexer refuses none of its tokens; the reference ANDs it, and
 * tests/test_schema_native.py finds the masks equal. */
static int SchemaCore_fill_enum(SchemaCore *self, int32_t *out) {
    const StepTables *t = (const StepTables *)self->tables;
    int exits = ((const uint8_t *)t->flags[self->field].buf)[self->node] & FIELD_EXITS;
    if (exits && t->plain_exits && t->exits == NULL) {
        return 0;
    }
    if (fill_one(t->kernels[self->field], out, self->node) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    if (exits) {
        /* (in a schema with a value that switches, the exits of the others are the reference's) */
        int done = t->plain_exits ? SchemaCore_fill_exits(self, out) : SchemaCore_fill_switch_exits(self, out);
        if (done <= 0) {
            return done;
        }
        and_keep(t->lex, t->keep_rows + self->lexer, out, out); /* (the rests are structure) */
    }
    Py_INCREF(Py_None);
    Py_SETREF(self->filled, Py_None); /* inside a value: the next token is read every way */
    return 1;
}

static PyObject *SchemaCore_fill(SchemaCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    int64_t row = 0;
    int done = 0;
    int kind = RESOLVED_OTHER;
    if (nargs >= 1 && nargs <= 2 && kwnames == NULL && ndarray_type != NULL && Py_TYPE(args[0]) == ndarray_type &&
        (nargs == 1 || exact_int(args[1], &row))) {
        kind = SchemaCore_resolve(self);
    }
    if (kind != RESOLVED_OTHER) {
        const ArrayHeader *h = (const ArrayHeader *)args[0];
        const int needed = ARRAY_C_CONTIGUOUS | ARRAY_ALIGNED | ARRAY_WRITEABLE;
        const Py_ssize_t width = ((const StepTables *)self->tables)->lex->width;
        if (h->descr == int32_descr && h->nd == 2 && (h->flags & needed) == needed && h->dimensions[1] == width &&
            row >= 0 && row < h->dimensions[0]) {
            int32_t *out = (int32_t *)h->data + row * width;
            done = kind == RESOLVED_ENUM ? SchemaCore_fill_enum(self, out)
                                         : SchemaCore_fill_structural(self, args[0], nargs == 2 ? args[1] : small_zero,
                                                                      out);
        }
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

static PyMethodDef SchemaCore_methods[] = {
    {"accept_token", (PyCFunction)(void (*)(void))SchemaCore_accept_token, METH_FASTCALL | METH_KEYWORDS,
     "accept_token($self, token_id)\n--\n\n"
     "Advance by one token; False (state unchanged) when it is not allowed."},
    {"fill_next_token_bitmask", (PyCFunction)(void (*)(void))SchemaCore_fill, METH_FASTCALL | METH_KEYWORDS,
     "fill_next_token_bitmask($self, bitmask, row=0)\n--\n\n"
     "Overwrite row ``row`` of ``bitmask`` (int32, ``(batch, ceil(vocab_size / 32))``,\n"
     "numpy or CPU torch) with the mask of the next token."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef SchemaCore_members[] = {
    {"_schema", T_OBJECT, offsetof(SchemaCore, schema), 0, "the compiled schema"},
    {"_history", T_OBJECT, offsetof(SchemaCore, history), 0, "what rollback restores (a deque)"},
    {"_output", T_OBJECT, offsetof(SchemaCore, output), 0, "the output so far (a bytearray)"},
    {"_lexer", T_LONGLONG, offsetof(SchemaCore, lexer), 0, "the JSON lexer state at the end of the output"},
    {"_filled", T_OBJECT, offsetof(SchemaCore, filled), 0, "the configurations a fill found no field to enter from"},
    {"_scratch", T_OBJECT, offsetof(SchemaCore, scratch), 0, "xgrammar's row when it is wider"},
    {"_scratch_width", T_LONGLONG, offsetof(SchemaCore, scratch_width), 0, "the row width"},
    {NULL, 0, 0, 0, NULL},
};

/* _configs: the configurations (a list), made now after steps inside a value (pending) */
static PyObject *SchemaCore_configs(SchemaCore *self, void *unused) {
    if (self->pending && SchemaCore_settle(self) < 0) {
        return NULL;
    }
    return Py_NewRef(self->configs == NULL ? Py_None : self->configs);
}

static int SchemaCore_set_configs(SchemaCore *self, PyObject *configs, void *unused) {
    if (configs == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_configs cannot be deleted");
        return -1;
    }
    if (self->pending) { /* `resolved`'s node is no longer the node of its list (it may come back) */
        SchemaCore_forget(self);
    }
    Py_INCREF(configs);
    Py_XSETREF(self->configs, configs);
    return 0;
}

static PyGetSetDef SchemaCore_getset[] = {
    {"_configs", (getter)SchemaCore_configs, (setter)SchemaCore_set_configs, "the configurations (a list)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject SchemaCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask.base._native.SchemaCore",
    .tp_basicsize = sizeof(SchemaCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The per-request state of triemask.SchemaMatcher and its structural step in C.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)SchemaCore_dealloc,
    .tp_methods = SchemaCore_methods,
    .tp_members = SchemaCore_members,
    .tp_getset = SchemaCore_getset,
};

/* The row width of a matcher's schema (its step tables'), or -1 where it has none. */
static Py_ssize_t SchemaCore_width(SchemaCore *m) {
    if (SchemaCore_resolve(m) != RESOLVED_OTHER) {
        return ((const StepTables *)m->tables)->lex->width;
    }
    PyObject *tables = m->schema == NULL ? NULL : PyObject_GetAttr(m->schema, str_step_tables);
    Py_ssize_t width = tables != NULL && Py_TYPE(tables) == &StepTablesType ? ((StepTables *)tables)->lex->width : -1;
    if (tables == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(tables);
    return width;
}

/* fill_schema_rows(matchers, bitmask, rows, batcher) -> True, or None to defer: row rows[i] of
 * `bitmask` for matchers[i] (rows None: row i). The structural rows go to xgrammar's
 * BatchGrammarMatcher (`batcher`: its handle) in one call, then the lexer's rows; every other
 * row through its matcher's own fill (which defers to the reference where it must).
 * Everything is checked before a row is written, and anything but a list or tuple of matchers
 * (SchemaCore instances) whose schemas' rows are the bitmask's width, a C-contiguous writable
 * int32 ndarray, and rows None or a list or tuple of exact ints inside the bitmask, one per
 * matcher, is None: fill_next_token_bitmasks's checks raise the typed error. */
static PyObject *fill_schema_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "fill_schema_rows(matchers, bitmask, rows, batcher)");
        return NULL;
    }
    PyObject *matchers = args[0], *bitmask = args[1], *rows = args[2];
    const ArrayHeader *h = (const ArrayHeader *)bitmask;
    const int needed = ARRAY_C_CONTIGUOUS | ARRAY_ALIGNED | ARRAY_WRITEABLE;
    if (!(PyList_CheckExact(matchers) || PyTuple_CheckExact(matchers)) ||
        !(rows == Py_None || PyList_CheckExact(rows) || PyTuple_CheckExact(rows)) || ndarray_type == NULL ||
        Py_TYPE(bitmask) != ndarray_type || h->descr != int32_descr || h->nd != 2 || (h->flags & needed) != needed) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(matchers);
    if (rows != Py_None && PySequence_Fast_GET_SIZE(rows) != n) {
        Py_RETURN_NONE;
    }
    PyObject **items = PySequence_Fast_ITEMS(matchers);
    int64_t *targets = PyMem_Malloc(sizeof(int64_t) * ((size_t)n + 1));
    char *batched = PyMem_Calloc((size_t)n + 1, 1);
    PyObject *handles = PyList_New(n), *indices = PyList_New(n), *result = NULL;
    if (targets == NULL || batched == NULL || handles == NULL || indices == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        goto done;
    }
    /* every check first (a deferred call writes nothing), the structural rows' handles with
     * them: one pass over the matchers, each read once before xgrammar's batch and once after */
    Py_ssize_t count = 0, pseudo_word = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + 4 < n) {
            PREFETCH(items[i + 4]);
        }
        SchemaCore *m = (SchemaCore *)items[i];
        int64_t row = i;
        if (!PyObject_TypeCheck(items[i], &SchemaCoreType) ||
            (rows != Py_None && !exact_int(PySequence_Fast_ITEMS(rows)[i], &row)) || row < 0 ||
            row >= h->dimensions[0] || SchemaCore_width(m) != h->dimensions[1]) {
            Py_INCREF(Py_None);
            result = Py_None;
            goto done;
        }
        targets[i] = row;
        if (SchemaCore_resolve(m) != RESOLVED_STRUCT || !((const StepTables *)m->tables)->lex->inline_pseudo) {
            continue; /* (inside a value, or xgrammar's rows wider: its own fill below, in C where it can) */
        }
        pseudo_word = ((const StepTables *)m->tables)->lex->pseudo_lo; /* (inside the row: inline) */
        PyObject *index = PyLong_FromLongLong(row);
        if (index == NULL) {
            goto done;
        }
        Py_INCREF(m->handle);
        PyList_SET_ITEM(handles, count, m->handle);
        PyList_SET_ITEM(indices, count, index);
        count++;
        batched[i] = 1;
    }
    Py_SET_SIZE(handles, count); /* (the items past count were never set) */
    Py_SET_SIZE(indices, count);
    if (PyList_GET_SIZE(handles) > 0) {
        /* (every matcher's row i, in order: no indices for xgrammar to read) */
        PyObject *rows_given = count == n && rows == Py_None ? Py_None : indices;
        PyObject *call[] = {args[3], handles, bitmask, rows_given, Py_False};
        PyObject *filled = PyObject_VectorcallMethod(str_batch_fill, call, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (filled == NULL) {
            goto done;
        }
        Py_DECREF(filled);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + 4 < n) { /* (the matcher, and the row's extra tokens' words, which xgrammar wrote long ago) */
            PREFETCH(items[i + 4]);
            if (batched[i + 4]) {
                PREFETCH((int32_t *)h->data + targets[i + 4] * h->dimensions[1] + pseudo_word);
            }
        }
        if (batched[i]) {
            int32_t *out = (int32_t *)h->data + targets[i] * h->dimensions[1];
            int finished = SchemaCore_finish_row((SchemaCore *)items[i], out, out);
            if (finished < 0) {
                goto done;
            }
            if (finished) {
                continue;
            }
        }
        PyObject *index = PyLong_FromLongLong(targets[i]);
        PyObject *call[] = {items[i], bitmask, index};
        PyObject *filled = index == NULL ? NULL
                                         : PyObject_VectorcallMethod(str_fill_next_token_bitmask, call,
                                                                     3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_XDECREF(index);
        if (filled == NULL) {
            goto done;
        }
        Py_DECREF(filled);
    }
    Py_INCREF(Py_True);
    result = Py_True;
done:
    PyMem_Free(targets);
    PyMem_Free(batched);
    Py_XDECREF(handles);
    Py_XDECREF(indices);
    return result;
}

/* split_tokens(data, offsets, lengths) -> tuple: token t's bytes data[offsets[t] : offsets[t] +
 * lengths[t]] (int64, int32), or None where lengths[t] < 0 (VocabularySupport.tokens; its
 * Python expression the reference). */
static PyObject *split_tokens(PyObject *module, PyObject *args) {
    Py_buffer data, offsets, lengths;
    if (!PyArg_ParseTuple(args, "y*y*y*", &data, &offsets, &lengths)) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = lengths.len / (Py_ssize_t)sizeof(int32_t);
    const int64_t *offs = (const int64_t *)offsets.buf;
    const int32_t *lens = (const int32_t *)lengths.buf;
    int bad = offsets.len != n * (Py_ssize_t)sizeof(int64_t) || lengths.len % sizeof(int32_t) != 0;
    for (Py_ssize_t t = 0; !bad && t < n; t++) {
        bad = lens[t] >= 0 && (offs[t] < 0 || offs[t] > data.len - lens[t]);
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "split_tokens: inconsistent token table");
        goto done;
    }
    result = PyTuple_New(n);
    for (Py_ssize_t t = 0; result != NULL && t < n; t++) {
        PyObject *token = lens[t] < 0 ? (Py_INCREF(Py_None), Py_None)
                                      : PyBytes_FromStringAndSize((const char *)data.buf + offs[t], lens[t]);
        if (token == NULL) {
            Py_CLEAR(result);
            break;
        }
        PyTuple_SET_ITEM(result, t, token);
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&lengths);
    return result;
}

/* lex_tokens(data, offsets, lengths, table, why) -> (after, refusals): the JSON
 * lexer over every token from every state (json_lexer.Lexical, its Python loop the reference).
 * Token t is data[offsets[t] : offsets[t] + lengths[t]] (int64, int32; a negative length: no
 * bytes, it moves nothing); table: uint8 [LEX_STATES * 256], the state after a byte
 * (LEX_STATES: refused); why: uint8 [LEX_STATES * 256], why refusing that byte from that state
 * is a refusal (json_lexer.REFUSED_*). Both answers are bytearrays [LEX_STATES * n], by start
 * state then token: the state after the token, and why it was refused (0 where it was not). */
static PyObject *lex_tokens(PyObject *module, PyObject *args) {
    Py_buffer data, offsets, lengths, table, why;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*", &data, &offsets, &lengths, &table, &why)) {
        return NULL;
    }
    PyObject *after = NULL, *refusals = NULL, *result = NULL;
    Py_ssize_t n = lengths.len / (Py_ssize_t)sizeof(int32_t);
    const int64_t *offs = (const int64_t *)offsets.buf;
    const int32_t *lens = (const int32_t *)lengths.buf;
    const uint8_t *bytes = (const uint8_t *)data.buf, *next = (const uint8_t *)table.buf,
                  *reason = (const uint8_t *)why.buf;
    int bad = offsets.len != n * (Py_ssize_t)sizeof(int64_t) || lengths.len % sizeof(int32_t) != 0 ||
              table.len != LEX_STATES * 256 || why.len != LEX_STATES * 256;
    for (Py_ssize_t i = 0; !bad && i < LEX_STATES * 256; i++) {
        bad = next[i] > LEX_STATES;
    }
    for (Py_ssize_t t = 0; !bad && t < n; t++) {
        bad = lens[t] >= 0 && (offs[t] < 0 || offs[t] > data.len - lens[t]);
    }
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "lex_tokens: inconsistent token table or lexer table");
        goto done;
    }
    after = PyByteArray_FromStringAndSize(NULL, LEX_STATES * n);
    refusals = PyByteArray_FromStringAndSize(NULL, LEX_STATES * n);
    if (after == NULL || refusals == NULL) {
        goto done;
    }
    uint8_t *a = (uint8_t *)PyByteArray_AS_STRING(after), *o = (uint8_t *)PyByteArray_AS_STRING(refusals);
    Py_BEGIN_ALLOW_THREADS
    for (int s = 0; s < LEX_STATES; s++) {
        for (Py_ssize_t t = 0; t < n; t++) {
            int state = s, refusal = 0;
            if (lens[t] > 0) {
                const uint8_t *p = bytes + offs[t], *end = p + lens[t];
                for (; p < end; p++) {
                    int following = next[state * 256 + *p];
                    if (following == LEX_STATES) {
                        refusal = reason[state * 256 + *p];
                        state = LEX_STATES;
                        break;
                    }
                    state = following;
                }
            }
            a[s * n + t] = (uint8_t)state;
            o[s * n + t] = (uint8_t)refusal;
        }
    }
    Py_END_ALLOW_THREADS
    result = PyTuple_Pack(2, after, refusals);
done:
    Py_XDECREF(after);
    Py_XDECREF(refusals);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&table);
    PyBuffer_Release(&why);
    return result;
}
