/*
 * triemask.base._native: the per-step and batch loops of TrieAutomaton in C.
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
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One extension, built as a unity of the files below (in this order: each uses what the ones
 * before it define). Each opens with what it holds:
 *
 *   kernel.c        the Kernel and Lazy types' data, building a Kernel from an automaton's arrays
 *   lazy_cache.c    the lazy layout's byte-bounded LRU of computed node edges
 *   step_fill.c     a node's edges, next / fill / fill_batch / next_batch / pairs; an updated set's
 *                   kernel (its parts merged at lookup)
 *   updates.c       with_values's walks of the removed values and its tombstone pass
 *   compile.c       the token index's tables and matching a value trie against the vocabulary
 *   dag_match.c     matching an acyclic automaton (a pattern's, a set's) against the vocabulary
 *   pattern_dag.c   the minimal acyclic automaton of a pattern's program, or of a trie
 *   regex_read.c    a finite pattern's text read into that program
 *   tries.c         sorting values and building byte tries; the token index's hash
 *   python_types.c  MatcherCore and AutomatonCore, the C base classes of Matcher and automata
 *   schema_step.c   SchemaCore, LexTables, StepTables: a mixed schema's common steps (xgrammar's handle,
 *                   the field tries' kernels)
 *   ebnf_controls.c whether xgrammar's printed grammar may admit a raw control character in a string
 *   json_walk.c     a loaded schema's dicts, depth, price and copy, whether it has anything to dispatch, its
 *                   annotations removed (schemas.reading)
 *   lazy_kernels.c  the lazy layout's Kernel: edges, spelling values, cache controls
 *   checks.c        the file format's checksum and the check that stored edges spell the values
 */
#include "csrc/kernel.c"
#include "csrc/lazy_cache.c"
#include "csrc/step_fill.c"
#include "csrc/updates.c"
#include "csrc/compile.c"
#include "csrc/dag_match.c"
#include "csrc/pattern_dag.c"
#include "csrc/regex_read.c"
#include "csrc/tries.c"
#include "csrc/python_types.c"
#include "csrc/schema_step.c"
#include "csrc/ebnf_controls.c"
#include "csrc/json_walk.c"
#include "csrc/lazy_kernels.c"
#include "csrc/checks.c"

/* ------------------------------------------------------------------ the module */

static PyMethodDef module_methods[] = {
    {"enable_ndarray_headers", enable_ndarray_headers, METH_VARARGS,
     "Check the mirror of NumPy's array header on three probes; read headers directly if it holds."},
    {"match_trie", match_trie, METH_VARARGS, "Token matching and edge CSR of a trie (see _compile._match)."},
    {"match_dag", match_dag, METH_VARARGS,
     "Token matching and edge CSR of an acyclic automaton (see triemask.sets.matching.match_dag)."},
    {"dag_of_trie", dag_of_trie, METH_VARARGS, "The minimal acyclic automaton of a trie (see triemask.base.dag)."},
    {"pattern_dag", pattern_dag, METH_VARARGS,
     "The minimal acyclic automaton of a finite pattern's syntax tree (see triemask.sets.regex)."},
    {"regex_program", regex_program, METH_VARARGS,
     "A finite pattern read into pattern_dag's program, or None to read it in Python (see triemask.sets.regex)."},
    {"build_trie", build_trie, METH_VARARGS, "The breadth-first trie of a set of byte strings (see _trie.build_trie)."},
    {"build_hash", build_hash, METH_VARARGS, "The token index's open-addressing table (see _token_index._build_hash)."},
    {"lazy_kernel", lazy_kernel, METH_VARARGS, "A Kernel over a lazy automaton's arrays (see triemask.automata.lazy)."},
    {"lazy_dag_layout", lazy_dag_layout, METH_VARARGS,
     "A ByteDag's arrays in the lazy layout (see triemask.sets.lazy)."},
    {"updated_kernel", updated_kernel, METH_VARARGS,
     "A Kernel over an updated set's parts (see triemask.automata.updated)."},
    {"walk_paths", walk_paths, METH_VARARGS, "The values' walks down a trie (see triemask.sets.update._walks)."},
    {"partner_nodes", partner_nodes, METH_VARARGS,
     "Per delta node, the base node of the same prefix (see triemask.sets.update._partners)."},
    {"tombstone_edges", tombstone_edges, METH_VARARGS,
     "The edges the removals cut (see triemask.sets.update._tombstones)."},
    {"split_tokens", split_tokens, METH_VARARGS,
     "split_tokens(data, offsets, lengths): each token's bytes, or None (VocabularySupport.tokens)."},
    {"lex_tokens", lex_tokens, METH_VARARGS,
     "lex_tokens(data, offsets, lengths, table, why): the JSON lexer over every token (json_lexer.Lexical)."},
    {"controls_in_strings", controls_in_strings, METH_O,
     "controls_in_strings(ebnf): whether xgrammar's printed grammar may admit a raw control in a string."},
    {"json_containers", json_containers, METH_O,
     "json_containers(node) -> (dicts, depth): every dict inside a loaded schema and how deeply it nests."},
    {"json_cost", json_cost, METH_O,
     "json_cost(node) -> (patterns, formats, optional_squares, dicts): what a schema asks of xgrammar's compile."},
    {"json_copy", json_copy, METH_O, "json_copy(node) -> a deep copy of a plain JSON schema, or None (take json)."},
    {"json_plain", json_plain, METH_VARARGS,
     "json_plain(node, keywords, unenforced, min_values) -> whether a loaded schema has nothing to dispatch."},
    {"schema_without", schema_without, METH_VARARGS,
     "schema_without(node, removed, one, lists, maps) -> node less the keys removed where they are keywords, or None."},
    {"fill_schema_rows", (PyCFunction)(void (*)(void))fill_schema_rows, METH_FASTCALL,
     "fill_schema_rows(matchers, bitmask, rows, batcher): schema rows, the structural ones in one xgrammar call\n"
     "(True), or None to defer to fill_next_token_bitmasks's checks."},
    {"checksum", checksum, METH_O, "The file format's checksum of a buffer (see triemask.base.storage.checksum)."},
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
    {"patch_info", (PyCFunction)Kernel_patch_info, METH_NOARGS,
     "An updated set's cut nodes and tokens and the bytes of its own table (None for other kernels)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject KernelType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "triemask.base._native.Kernel",
    .tp_basicsize = sizeof(Kernel),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Read-only views of one automaton's arrays, with the per-step and batch loops.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Kernel_init,
    .tp_dealloc = (destructor)Kernel_dealloc,
    .tp_methods = Kernel_methods,
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "triemask.base._native",
    "C loops for triemask's per-step, batch and compile paths (the NumPy code is the reference).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&KernelType) < 0 || PyType_Ready(&TablesType) < 0 || PyType_Ready(&MatcherCoreType) < 0 ||
        PyType_Ready(&AutomatonCoreType) < 0 || PyType_Ready(&SchemaCoreType) < 0 ||
        PyType_Ready(&StepTablesType) < 0 || PyType_Ready(&LexTablesType) < 0 || PyType_Ready(&HistoryType) < 0 ||
        PyType_Ready(&TokenTrieTablesType) < 0) {
        return NULL;
    }
    byte_groups_init();
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
    str_pattern = PyUnicode_InternFromString("pattern");
    str_format = PyUnicode_InternFromString("format");
    str_properties = PyUnicode_InternFromString("properties");
    str_required = PyUnicode_InternFromString("required");
    str_enum = PyUnicode_InternFromString("enum");
    str_any_of = PyUnicode_InternFromString("anyOf");
    str_one_of = PyUnicode_InternFromString("oneOf");
    str_const = PyUnicode_InternFromString("const");
    if (str_pattern == NULL || str_format == NULL || str_properties == NULL || str_required == NULL ||
        str_enum == NULL || str_any_of == NULL || str_one_of == NULL || str_const == NULL) {
        return NULL;
    }
    str_handle = PyUnicode_InternFromString("_handle");
    str_step_tables = PyUnicode_InternFromString("_step_tables");
    str_switch_exits = PyUnicode_InternFromString("_switch_exits");
    str_accept_token = PyUnicode_InternFromString("accept_token");
    str_fill_next_token_bitmask = PyUnicode_InternFromString("fill_next_token_bitmask");
    str_batch_fill = PyUnicode_InternFromString("batch_fill_next_token_bitmask");
    str_accept_string = PyUnicode_InternFromString("accept_string");
    str_rollback = PyUnicode_InternFromString("rollback");
    small_zero = PyLong_FromLong(0);
    small_one = PyLong_FromLong(1);
    if (str_accept_string == NULL || str_rollback == NULL || small_one == NULL) {
        return NULL;
    }
    struct_field = PyLong_FromLong(STRUCT_FIELD);
    empty_bytes = PyBytes_FromStringAndSize(NULL, 0);
    if (struct_field == NULL || empty_bytes == NULL || str_handle == NULL || str_step_tables == NULL ||
        str_switch_exits == NULL || str_accept_token == NULL || str_fill_next_token_bitmask == NULL ||
        str_batch_fill == NULL || small_zero == NULL) {
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
    PyTypeObject *schema_types[] = {&SchemaCoreType, &StepTablesType, &LexTablesType, &HistoryType};
    const char *schema_names[] = {"SchemaCore", "StepTables", "LexTables", "History"};
    for (int i = 0; i < 4; i++) {
        Py_INCREF(schema_types[i]);
        if (PyModule_AddObject(module, schema_names[i], (PyObject *)schema_types[i]) < 0) {
            Py_DECREF(schema_types[i]);
            Py_DECREF(module);
            return NULL;
        }
    }
    PyTypeObject *table_types[] = {&TablesType, &TokenTrieTablesType};
    const char *table_names[] = {"Tables", "TokenTrieTables"};
    for (int i = 0; i < 2; i++) {
        Py_INCREF(table_types[i]);
        if (PyModule_AddObject(module, table_names[i], (PyObject *)table_types[i]) < 0) {
            Py_DECREF(table_types[i]);
            Py_DECREF(module);
            return NULL;
        }
    }
    return module;
}
