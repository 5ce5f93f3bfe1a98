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
#include <stdint.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    Py_buffer edge_offsets; /* int32, num_nodes + 2 */
    Py_buffer edge_tokens;  /* int32 */
    Py_buffer edge_dests;   /* int32 */
    Py_buffer mask_offsets; /* int32, num_nodes + 2 */
    Py_buffer mask_words;   /* int64 */
    Py_buffer mask_bits;    /* int32 */
    int held;               /* how many of the buffers above are held */
    int64_t num_nodes;
    int64_t num_states;
    Py_ssize_t width;
} Kernel;

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

static void Kernel_dealloc(Kernel *self) {
    Py_buffer *views[6] = {&self->edge_offsets, &self->edge_tokens, &self->edge_dests,
                           &self->mask_offsets, &self->mask_words, &self->mask_bits};
    for (int i = 0; i < self->held; i++) {
        PyBuffer_Release(views[i]);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Kernel_init(Kernel *self, PyObject *args, PyObject *kwds) {
    PyObject *objs[6];
    long long num_nodes, num_states;
    Py_ssize_t width;
    if (self->held) {
        PyErr_SetString(PyExc_RuntimeError, "Kernel is already initialised");
        return -1;
    }
    if (!PyArg_ParseTuple(args, "OOOOOOLLn", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5],
                          &num_nodes, &num_states, &width)) {
        return -1;
    }
    Py_buffer *views[6] = {&self->edge_offsets, &self->edge_tokens, &self->edge_dests,
                           &self->mask_offsets, &self->mask_words, &self->mask_bits};
    static const Py_ssize_t sizes[6] = {4, 4, 4, 4, 8, 4};
    static const char *names[6] = {"edge_offsets", "edge_tokens", "edge_dests",
                                   "mask_offsets", "mask_words", "mask_bits"};
    for (int i = 0; i < 6; i++) {
        if (get_array(objs[i], views[i], sizes[i], names[i]) < 0) {
            return -1;
        }
        self->held = i + 1;
    }
    if (num_nodes < 0 || num_states < num_nodes || width < 1 ||
        self->edge_offsets.shape[0] != num_nodes + 2 || self->mask_offsets.shape[0] != num_nodes + 2 ||
        self->edge_tokens.shape[0] != self->edge_dests.shape[0] ||
        self->mask_words.shape[0] != self->mask_bits.shape[0]) {
        PyErr_SetString(PyExc_ValueError, "inconsistent automaton arrays");
        return -1;
    }
    /* Every offset, word index and destination is checked once here, so that no later
       call can read or write out of bounds whatever the arrays hold. */
    const int32_t *eo = (const int32_t *)self->edge_offsets.buf;
    const int32_t *mo = (const int32_t *)self->mask_offsets.buf;
    const int32_t *dests = (const int32_t *)self->edge_dests.buf;
    const int64_t *words = (const int64_t *)self->mask_words.buf;
    Py_ssize_t edges = self->edge_tokens.shape[0], nwords = self->mask_words.shape[0];
    for (int64_t i = 0; i < num_nodes + 2; i++) {
        if (eo[i] < 0 || eo[i] > edges || mo[i] < 0 || mo[i] > nwords ||
            (i > 0 && (eo[i] < eo[i - 1] || mo[i] < mo[i - 1]))) {
            PyErr_SetString(PyExc_ValueError, "automaton offsets out of order or out of range");
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < edges; i++) {
        if (dests[i] < 0 || dests[i] >= num_states) {
            PyErr_SetString(PyExc_ValueError, "automaton destination out of range");
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < nwords; i++) {
        if (words[i] < 0 || words[i] >= width) {
            PyErr_SetString(PyExc_ValueError, "mask word index out of range");
            return -1;
        }
    }
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

static inline int32_t next_of(const Kernel *self, int64_t state, int64_t token) {
    if (state < 0 || state >= self->num_nodes) {
        return -1; /* final and DEAD states allow nothing */
    }
    const int32_t *offsets = (const int32_t *)self->edge_offsets.buf;
    const int32_t *tokens = (const int32_t *)self->edge_tokens.buf;
    int32_t lo = offsets[state], hi = offsets[state + 1];
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (tokens[mid] < token) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo < offsets[state + 1] && tokens[lo] == token) {
        return ((const int32_t *)self->edge_dests.buf)[lo];
    }
    return -1;
}

static inline void fill_one(const Kernel *self, int32_t *row, int64_t node) {
    memset(row, 0, (size_t)self->width * sizeof(int32_t));
    if (node < 0 || node >= self->num_nodes) {
        return;
    }
    const int32_t *offsets = (const int32_t *)self->mask_offsets.buf;
    const int64_t *words = (const int64_t *)self->mask_words.buf;
    const int32_t *bits = (const int32_t *)self->mask_bits.buf;
    for (int32_t i = offsets[node]; i < offsets[node + 1]; i++) {
        row[words[i]] = bits[i];
    }
}

static int valid_state(const Kernel *self, int64_t state) {
    return state >= -1 && state < self->num_states;
}

static PyObject *Kernel_next(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t state, token;
    if (nargs != 2 || !exact_int(args[0], &state) || !exact_int(args[1], &token) || !valid_state(self, state)) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(next_of(self, state, token));
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

static PyObject *Kernel_fill(Kernel *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t row, state;
    Py_buffer view;
    if (nargs != 3 || !exact_int(args[1], &row) || !exact_int(args[2], &state) || !valid_state(self, state)) {
        Py_RETURN_NONE;
    }
    if (!get_bitmask(self, args[0], &view)) {
        Py_RETURN_NONE;
    }
    if (row < 0 || row >= view.shape[0]) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    fill_one(self, (int32_t *)view.buf + row * self->width, state);
    PyBuffer_Release(&view);
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
    if (ok) {
        int32_t *base = (int32_t *)mask.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < batch; i++) {
            fill_one(self, base + (have_rows ? r[i] : i) * self->width, s[i]);
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&mask);
    release_ints(&states);
    if (have_rows) {
        release_ints(&rows);
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
    if (ok) {
        int32_t *o = (int32_t *)out.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < batch; i++) {
            o[i] = next_of(self, s[i], t[i]);
        }
        Py_END_ALLOW_THREADS
    }
    release_ints(&states);
    release_ints(&tokens);
    PyBuffer_Release(&out);
    if (!ok) {
        Py_RETURN_NONE;
    }
    Py_RETURN_TRUE;
}

static PyMethodDef Kernel_methods[] = {
    {"next", (PyCFunction)(void (*)(void))Kernel_next, METH_FASTCALL,
     "next(state, token) -> next state (-1: not allowed), or None to defer to Python's checks"},
    {"fill", (PyCFunction)(void (*)(void))Kernel_fill, METH_FASTCALL,
     "fill(bitmask, row, state) -> True, or None to defer to Python's checks"},
    {"fill_batch", (PyCFunction)(void (*)(void))Kernel_fill_batch, METH_FASTCALL,
     "fill_batch(bitmask, states, rows_or_None) -> True, or None to defer (lists of ints or int64 arrays)"},
    {"next_batch", (PyCFunction)(void (*)(void))Kernel_next_batch, METH_FASTCALL,
     "next_batch(states, tokens, out_int32) -> True, or None to defer (lists of ints or int64 arrays)"},
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
    "C loops for triemask's per-step and batch paths (the NumPy code is the reference).", -1, NULL,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&KernelType) < 0) {
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
    return module;
}
