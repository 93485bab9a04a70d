/* tinyengine._C: the native part of tinyengine (build info and a checksum). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

static PyObject *build_info(PyObject *self, PyObject *args) {
#if defined(__VERSION__)
    const char *cc = __VERSION__;
#else
    const char *cc = "unknown";
#endif
    return PyUnicode_FromFormat("tinyengine._C cc=%s python=%s", cc, PY_VERSION);
}

/* 64-bit FNV-1a over a bytes-like object, returned as 16 hex digits. */
static PyObject *fnv1a64(PyObject *self, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *p = (const unsigned char *)buf.buf;
    for (Py_ssize_t i = 0; i < buf.len; i++) { h ^= p[i]; h *= 1099511628211ULL; }
    PyBuffer_Release(&buf);
    char out[17];
    snprintf(out, sizeof out, "%016llx", (unsigned long long)h);
    return PyUnicode_FromString(out);
}

static PyMethodDef methods[] = {
    {"build_info", build_info, METH_NOARGS, "Compiler and Python the module was built with."},
    {"fnv1a64", fnv1a64, METH_VARARGS, "64-bit FNV-1a of a bytes-like object (hex)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", NULL, -1, methods};

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&module); }
