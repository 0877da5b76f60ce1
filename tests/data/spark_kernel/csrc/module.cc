// sparkbuild test data: the Python module that carries the kernels.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef spark_kernels = {PyModuleDef_HEAD_INIT, "_kernels", nullptr, -1,
                                           nullptr};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&spark_kernels); }
