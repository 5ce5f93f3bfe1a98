/* ------------------------------------------------------------------ a loaded schema's containers */

/* json_containers(node) -> (dicts, depth): every exact dict inside `node`, itself included, in
 * the order of schemas.reading._dicts_within (a stack: the last child first), and how deeply
 * its containers nest (reading._depth: node itself is level 1). Exact dicts and lists are the
 * only containers entered, as in the Python reference, which the tests compare it with. The
 * stack is the heap's, so a deep schema costs memory, never the C stack: the callers refuse
 * depth afterwards. (A loaded schema is a tree: a container that holds itself, which only a
 * caller's own dict can be, makes both walks run until memory runs out; load_schema
 * rejects one before.) */
typedef struct {
    PyObject *item; /* borrowed: held by its parent for the walk's length */
    Py_ssize_t level;
} WalkEntry;

static int walk_push(WalkEntry **stack, Py_ssize_t *size, Py_ssize_t *capacity, PyObject *item, Py_ssize_t level) {
    if (*size == *capacity) {
        Py_ssize_t grown = *capacity * 2;
        WalkEntry *moved = PyMem_Realloc(*stack, sizeof(WalkEntry) * (size_t)grown);
        if (moved == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        *stack = moved;
        *capacity = grown;
    }
    (*stack)[(*size)++] = (WalkEntry){item, level};
    return 0;
}

static int is_container(PyObject *item) { return PyDict_CheckExact(item) || PyList_CheckExact(item); }

static PyObject *json_containers(PyObject *module, PyObject *node) {
    PyObject *dicts = PyList_New(0);
    Py_ssize_t size = 0, capacity = 64, depth = 0;
    WalkEntry *stack = PyMem_Malloc(sizeof(WalkEntry) * (size_t)capacity);
    if (dicts == NULL || stack == NULL) {
        Py_XDECREF(dicts);
        PyMem_Free(stack);
        return PyErr_NoMemory();
    }
    if (is_container(node) && walk_push(&stack, &size, &capacity, node, 1) < 0) {
        goto failed;
    }
    while (size > 0) {
        WalkEntry entry = stack[--size];
        depth = entry.level > depth ? entry.level : depth;
        if (PyDict_CheckExact(entry.item)) {
            if (PyList_Append(dicts, entry.item) < 0) {
                goto failed;
            }
            Py_ssize_t position = 0;
            PyObject *key, *value;
            while (PyDict_Next(entry.item, &position, &key, &value)) {
                if (is_container(value) && walk_push(&stack, &size, &capacity, value, entry.level + 1) < 0) {
                    goto failed;
                }
            }
        } else {
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(entry.item); i++) {
                PyObject *value = PyList_GET_ITEM(entry.item, i);
                if (is_container(value) && walk_push(&stack, &size, &capacity, value, entry.level + 1) < 0) {
                    goto failed;
                }
            }
        }
    }
    PyMem_Free(stack);
    return Py_BuildValue("(Nn)", dicts, depth);
failed:
    PyMem_Free(stack);
    Py_DECREF(dicts);
    return NULL;
}

/* ------------------------------------------------------------------ a schema's price */

/* json_cost(node) -> (patterns, formats, optional_squares, dicts): what schemas.reading.
 * structure_cost counts, over json_containers' dicts: a str "pattern", a str "format", for a
 * dict "properties" the square of how many of its names no str of a list "required" names,
 * and the dicts themselves. The reference is structure_cost's Python loop. */
static PyObject *str_pattern, *str_format, *str_properties, *str_required; /* interned at import */

static PyObject *json_cost(PyObject *module, PyObject *node) {
    PyObject *walked = json_containers(module, node);
    if (walked == NULL) {
        return NULL;
    }
    PyObject *dicts = PyTuple_GET_ITEM(walked, 0);
    long long patterns = 0, formats = 0, squares = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(dicts); i++) {
        PyObject *dict = PyList_GET_ITEM(dicts, i);
        PyObject *pattern = PyDict_GetItemWithError(dict, str_pattern); /* borrowed */
        PyObject *format = PyDict_GetItemWithError(dict, str_format);
        PyObject *properties = PyDict_GetItemWithError(dict, str_properties);
        if (PyErr_Occurred()) { /* (only a key of the caller's own type can raise in its __eq__) */
            goto failed;
        }
        patterns += pattern != NULL && PyUnicode_Check(pattern);
        formats += format != NULL && PyUnicode_Check(format);
        if (properties == NULL || !PyDict_Check(properties)) {
            continue;
        }
        PyObject *required = PyDict_GetItemWithError(dict, str_required);
        if (PyErr_Occurred()) {
            goto failed;
        }
        PyObject *named = PySet_New(NULL);
        if (named == NULL) {
            goto failed;
        }
        for (Py_ssize_t r = 0; required != NULL && PyList_Check(required) && r < PyList_GET_SIZE(required); r++) {
            PyObject *name = PyList_GET_ITEM(required, r);
            if (PyUnicode_Check(name) && PySet_Add(named, name) < 0) {
                Py_DECREF(named);
                goto failed;
            }
        }
        long long optional = 0;
        Py_ssize_t position = 0;
        PyObject *key, *value;
        while (PyDict_Next(properties, &position, &key, &value)) {
            int found = PySet_Contains(named, key);
            if (found < 0) {
                Py_DECREF(named);
                goto failed;
            }
            optional += !found;
        }
        Py_DECREF(named);
        squares += optional * optional;
    }
    Py_ssize_t count = PyList_GET_SIZE(dicts);
    Py_DECREF(walked);
    return Py_BuildValue("(LLLn)", patterns, formats, squares, count);
failed:
    Py_DECREF(walked);
    return NULL;
}

/* ------------------------------------------------------------------ nothing to dispatch */

/* json_plain(node, keywords, unenforced, min_values) -> bool: schemas.reading.
 * _nothing_to_dispatch's answer (its Python loop is the reference the tests compare this with),
 * over json_containers' dicts. A dict with no key of `keywords` is plain; one with a key of
 * `unenforced`, or an exact str "pattern" or "format", is not; an "enum" absent, null or a dict
 * (a property named "enum") leaves "anyOf" and "oneOf", plain unless an exact list of at least
 * `min_values` branches or with a dict branch holding "const"; else the "enum" must be an
 * exact list of 1 .. min_values - 1 values whose exact strs are UTF-8 (no lone surrogate). */
static PyObject *str_enum, *str_any_of, *str_one_of, *str_const; /* interned at import */

/* 1: one of `dict`'s keys is in `keys`; 0: none; -1: failed. */
static int dict_holds_any(PyObject *dict, PyObject *keys) {
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &at, &key, &value)) {
        int found = PySet_Contains(keys, key);
        if (found != 0) {
            return found;
        }
    }
    return 0;
}

/* 1: plain; 0: not; -1: failed. */
static int plain_dict(PyObject *dict, PyObject *keywords, PyObject *unenforced, Py_ssize_t min_values) {
    int holds = dict_holds_any(dict, keywords);
    if (holds <= 0) {
        return holds < 0 ? -1 : 1; /* (most dicts: no keyword at all) */
    }
    if ((holds = dict_holds_any(dict, unenforced)) != 0) {
        return holds < 0 ? -1 : 0;
    }
    PyObject *pattern = PyDict_GetItemWithError(dict, str_pattern); /* borrowed */
    PyObject *format = PyDict_GetItemWithError(dict, str_format);
    PyObject *values = PyDict_GetItemWithError(dict, str_enum);
    if (PyErr_Occurred()) {
        return -1;
    }
    if ((pattern != NULL && PyUnicode_CheckExact(pattern)) || (format != NULL && PyUnicode_CheckExact(format))) {
        return 0;
    }
    if (values == NULL || values == Py_None || PyDict_CheckExact(values)) {
        PyObject *unions[] = {str_any_of, str_one_of};
        for (int u = 0; u < 2; u++) {
            PyObject *branches = PyDict_GetItemWithError(dict, unions[u]);
            if (branches == NULL && PyErr_Occurred()) {
                return -1;
            }
            if (branches == NULL || !PyList_CheckExact(branches)) {
                continue;
            }
            if (PyList_GET_SIZE(branches) >= min_values) {
                return 0; /* (perhaps a union of consts: an enum) */
            }
            for (Py_ssize_t b = 0; b < PyList_GET_SIZE(branches); b++) {
                PyObject *branch = PyList_GET_ITEM(branches, b);
                int has_const = PyDict_CheckExact(branch) ? PyDict_Contains(branch, str_const) : 0;
                if (has_const != 0) {
                    return has_const < 0 ? -1 : 0; /* (perhaps a discriminated union) */
                }
            }
        }
        return 1;
    }
    if (!PyList_CheckExact(values) || PyList_GET_SIZE(values) == 0 || PyList_GET_SIZE(values) >= min_values) {
        return 0;
    }
    for (Py_ssize_t v = 0; v < PyList_GET_SIZE(values); v++) {
        PyObject *value = PyList_GET_ITEM(values, v);
        if (PyUnicode_CheckExact(value) && PyUnicode_AsUTF8AndSize(value, NULL) == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
                return -1;
            }
            PyErr_Clear();
            return 0; /* (the full visit names the value) */
        }
    }
    return 1;
}

static PyObject *json_plain(PyObject *module, PyObject *args) {
    PyObject *node, *keywords, *unenforced;
    Py_ssize_t min_values;
    if (!PyArg_ParseTuple(args, "OO!O!n:json_plain", &node, &PyFrozenSet_Type, &keywords, &PyFrozenSet_Type,
                          &unenforced, &min_values)) {
        return NULL;
    }
    PyObject *walked = json_containers(module, node);
    if (walked == NULL) {
        return NULL;
    }
    PyObject *dicts = PyTuple_GET_ITEM(walked, 0);
    int plain = 1;
    for (Py_ssize_t i = 0; plain == 1 && i < PyList_GET_SIZE(dicts); i++) {
        plain = plain_dict(PyList_GET_ITEM(dicts, i), keywords, unenforced, min_values);
    }
    Py_DECREF(walked);
    return plain < 0 ? NULL : PyBool_FromLong(plain);
}

/* ------------------------------------------------------------------ a caller's schema copied */

/* json_copy(node) -> a copy, or None: a deep copy of a caller's schema made of exact dicts with
 * str keys, exact lists, str, int, bool, None and finite floats (leaves shared: they are
 * immutable), what json.loads(json.dumps(node)) gives for it, in a fraction of the time.
 * Anything else (tuples, other key types, subclasses, NaN, a container that holds itself, more
 * than JSON_COPY_DEPTH levels) gives None: the caller then takes that round trip, which
 * converts or names it. The recursion is bounded by JSON_COPY_DEPTH, far below the C stack. */
#define JSON_COPY_DEPTH 256

static int json_leaf(PyObject *item) {
    if (PyUnicode_CheckExact(item) || PyLong_CheckExact(item) || PyBool_Check(item) || item == Py_None) {
        return 1;
    }
    return PyFloat_CheckExact(item) && isfinite(PyFloat_AS_DOUBLE(item));
}

/* NULL with no error set: not copyable here (the caller falls back); NULL with an error: failed. */
static PyObject *json_copy_at(PyObject *item, int level) {
    if (json_leaf(item)) {
        Py_INCREF(item);
        return item;
    }
    if (level >= JSON_COPY_DEPTH) {
        return NULL;
    }
    if (PyList_CheckExact(item)) {
        Py_ssize_t n = PyList_GET_SIZE(item);
        PyObject *copy = PyList_New(n);
        for (Py_ssize_t i = 0; copy != NULL && i < n; i++) {
            PyObject *inner = json_copy_at(PyList_GET_ITEM(item, i), level + 1);
            if (inner == NULL) {
                Py_CLEAR(copy);
                break;
            }
            PyList_SET_ITEM(copy, i, inner);
        }
        return copy;
    }
    if (!PyDict_CheckExact(item)) {
        return NULL;
    }
    PyObject *copy = PyDict_New();
    Py_ssize_t position = 0;
    PyObject *key, *value;
    while (copy != NULL && PyDict_Next(item, &position, &key, &value)) {
        PyObject *inner = PyUnicode_CheckExact(key) ? json_copy_at(value, level + 1) : NULL;
        if (inner == NULL || PyDict_SetItem(copy, key, inner) < 0) {
            Py_XDECREF(inner);
            Py_CLEAR(copy);
        } else {
            Py_DECREF(inner);
        }
    }
    return copy;
}

static PyObject *json_copy(PyObject *module, PyObject *node) {
    /* The copy is all new containers: collections during it would scan them for nothing (40% of
     * the time). The GIL is held throughout, so no other code runs while the collector is off. */
    int collecting = PyGC_Disable();
    PyObject *copy = json_copy_at(node, 0);
    if (collecting) {
        PyGC_Enable();
    }
    if (copy == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return copy;
}

/* ------------------------------------------------------------------ a schema's annotations removed */

/* schema_without(node, removed, one, lists, maps) -> `node` less the keys in `removed` wherever
 * they are keywords of a subschema, or None: the subschemas are `node` and, below one, the value
 * of a keyword in `one`, the items of a list under a keyword in `lists`, the values of a dict
 * under a keyword in `maps` (frozensets: schemas.reading's tables; the tests compare this with
 * its _without_annotations_reference). What holds nothing removed is returned itself, shared,
 * not copied: a schema without annotations costs one pass and no allocation. Recursion is
 * bounded by JSON_COPY_DEPTH: deeper gives None (the caller keeps the schema as it is). */
typedef struct {
    PyObject *removed, *one, *lists, *maps;
} SchemaKeywords;

/* NULL with no error set: too deep; NULL with an error: failed. */
static PyObject *schema_without_at(PyObject *node, const SchemaKeywords *keywords, int level);

/* The value of keyword `key` of a subschema, with the subschemas it holds done. */
static PyObject *schema_without_in(PyObject *key, PyObject *value, const SchemaKeywords *keywords, int level) {
    int holds;
    if (PyList_CheckExact(value)) {
        if ((holds = PySet_Contains(keywords->lists, key)) <= 0) {
            return holds < 0 ? NULL : Py_NewRef(value);
        }
        PyObject *copy = NULL;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); i++) {
            PyObject *item = PyList_GET_ITEM(value, i);
            PyObject *done = schema_without_at(item, keywords, level + 1);
            if (done == NULL || (done != item && copy == NULL &&
                                 (copy = PyList_GetSlice(value, 0, PyList_GET_SIZE(value))) == NULL)) {
                Py_XDECREF(done);
                Py_XDECREF(copy);
                return NULL;
            }
            if (copy != NULL) {
                PyList_SetItem(copy, i, done); /* (steals done) */
            } else {
                Py_DECREF(done);
            }
        }
        return copy != NULL ? copy : Py_NewRef(value);
    }
    if (!PyDict_CheckExact(value)) {
        return Py_NewRef(value);
    }
    if ((holds = PySet_Contains(keywords->maps, key)) < 0) {
        return NULL;
    }
    if (!holds) {
        if ((holds = PySet_Contains(keywords->one, key)) <= 0) {
            return holds < 0 ? NULL : Py_NewRef(value);
        }
        return schema_without_at(value, keywords, level + 1);
    }
    PyObject *copy = NULL, *name, *child;
    Py_ssize_t at = 0;
    while (PyDict_Next(value, &at, &name, &child)) {
        PyObject *done = schema_without_at(child, keywords, level + 1);
        int failed = done == NULL || (done != child && ((copy == NULL && (copy = PyDict_Copy(value)) == NULL) ||
                                                        PyDict_SetItem(copy, name, done) < 0));
        Py_XDECREF(done);
        if (failed) {
            Py_XDECREF(copy);
            return NULL;
        }
    }
    return copy != NULL ? copy : Py_NewRef(value);
}

static PyObject *schema_without_at(PyObject *node, const SchemaKeywords *keywords, int level) {
    if (!PyDict_CheckExact(node)) {
        return Py_NewRef(node);
    }
    if (level >= JSON_COPY_DEPTH) {
        return NULL;
    }
    PyObject *copy = NULL, *key, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(node, &at, &key, &value)) {
        int removed = PySet_Contains(keywords->removed, key);
        PyObject *done = removed == 0 ? schema_without_in(key, value, keywords, level) : NULL;
        if (removed < 0 || (removed == 0 && done == NULL)) {
            Py_XDECREF(copy);
            return NULL;
        }
        if (removed || done != value) {
            /* (the copy is changed, the dict walked is not: its iteration stays valid) */
            int failed = (copy == NULL && (copy = PyDict_Copy(node)) == NULL) ||
                         (removed ? PyDict_DelItem(copy, key) : PyDict_SetItem(copy, key, done)) < 0;
            Py_XDECREF(done);
            if (failed) {
                Py_XDECREF(copy);
                return NULL;
            }
        } else {
            Py_DECREF(done);
        }
    }
    return copy != NULL ? copy : Py_NewRef(node);
}

static PyObject *schema_without(PyObject *module, PyObject *args) {
    PyObject *node;
    SchemaKeywords keywords;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!:schema_without", &node, &PyFrozenSet_Type, &keywords.removed,
                          &PyFrozenSet_Type, &keywords.one, &PyFrozenSet_Type, &keywords.lists, &PyFrozenSet_Type,
                          &keywords.maps)) {
        return NULL;
    }
    PyObject *done = schema_without_at(node, &keywords, 0);
    if (done == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return done;
}
