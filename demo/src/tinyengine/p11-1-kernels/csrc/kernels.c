/* tinyengine._kernels: native helpers of the batch-invariant kernels (built with CMake, uses tinykernels). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <tinykernels.h>

/* switch_on(value) -> bool: the kernel switch rule of tinykernels (DEMO_BATCH_INVARIANT's values). */
static PyObject *switch_on(PyObject *self, PyObject *args) {
    const char *value = NULL;
    if (!PyArg_ParseTuple(args, "z", &value)) return NULL;
    return PyBool_FromLong(tk_switch_on(value));
}

static PyObject *version(PyObject *self, PyObject *args) {
    return PyUnicode_FromString("tinykernels " TINYKERNELS_VERSION);
}

static PyMethodDef methods[] = {
    {"switch_on", switch_on, METH_VARARGS, "Whether a kernel switch value is on (tinykernels' rule)."},
    {"version", version, METH_NOARGS, "The tinykernels version the module was built with."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
