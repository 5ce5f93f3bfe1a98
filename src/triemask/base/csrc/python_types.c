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
    .tp_name = "triemask.base._native.MatcherCore",
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
    .tp_name = "triemask.base._native.AutomatonCore",
    .tp_basicsize = sizeof(AutomatonCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The base of triemask.TrieAutomaton: its per-step methods in C.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)AutomatonCore_dealloc,
    .tp_methods = AutomatonCore_methods,
    .tp_members = AutomatonCore_members,
};

