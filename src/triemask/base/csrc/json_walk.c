/* ------------------------------------------------------------------ a loaded schema's containers */

/* json_containers(node) -> (dicts, depth): every exact dict inside `node`, itself included, in
 * the order of schemas.reading._dicts_within (a stack: the last child first), and how deeply
 * its containers nest (reading._depth: node itself is level 1). Exact dicts and lists are the
 * only containers entered, as in the Python reference, which the tests compare it with. The
 * stack is the heap's, so a deep schema costs memory, never the C stack: the callers refuse
 * depth afterwards. (A loaded schema is a tree: a container that holds itself, which only a
 * caller's own dict can be, makes both walks run until memory runs out; load_schema_text
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
