/* eagle3kit._fastints: pack a list/tuple of Python ints into an int32 buffer.
 *
 * Why this exists: np.array(list, dtype=np.int32) costs ~22 ns/int and
 * struct.pack ~11 ns/int, because both go through generic per-item machinery
 * (dtype discovery, format parsing, argument tuples).  Token-id rows are plain
 * lists of small ints, so a direct loop over the list's item array that reads
 * one-digit ints inline is ~2 ns/int.  The module is optional: the pure-Python
 * fallback in eagle3kit/format/_ints.py gives identical results.
 *
 * Semantics (mirrored by the fallback):
 *   - items: any sequence/iterable (lists and tuples are not copied);
 *   - each item must be an int or implement __index__ (bool and numpy integer
 *     scalars are accepted, True -> 1); anything else (float, str) -> TypeError;
 *   - a value outside [-2**31, 2**31-1] -> OverflowError naming value and index;
 *   - bytes are written little-endian; items before a failing one are already
 *     written (no rollback: callers discard the row on error).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#if PY_VERSION_HEX < 0x030B0000
#include <longintrepr.h> /* 3.10: PyLongObject layout is not pulled in by Python.h */
#endif

/* Hot path: read a one-digit ("compact") exact int without a function call.
 * Such values have |v| < 2**30 (or 2**15), so they always fit int32.  This
 * alone is what takes the loop from ~5 to ~2 ns/int; everything else (bigger
 * ints, bool, numpy scalars) goes through PyLong_AsLongAndOverflow. */
static inline int compact_value(PyObject *o, int32_t *v) {
    if (!PyLong_CheckExact(o)) return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (!PyUnstable_Long_IsCompact((PyLongObject *)o)) return 0;
    *v = (int32_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
#else
    Py_ssize_t size = Py_SIZE(o);
    if (size < -1 || size > 1) return 0;
    /* Branchless: size is -1/0/1 and ob_digit[0] is always allocated. */
    *v = (int32_t)(size * (Py_ssize_t)((PyLongObject *)o)->ob_digit[0]);
#endif
    return 1;
}

/* Slow path for everything else: ints >= 2**30, int subclasses (bool), and
 * objects with __index__ (numpy integer scalars).  Returns 0 or -1 with an
 * exception set.  The caller holds a reference to item because __index__ can
 * run arbitrary code that mutates the list being packed. */
static int slow_value(PyObject *item, Py_ssize_t i, int32_t *out) {
    int overflow;
    long v = PyLong_AsLongAndOverflow(item, &overflow); /* calls __index__ if needed */
    if (v == -1 && !overflow && PyErr_Occurred()) {
        /* Re-raise with the index so a bad row is easy to locate. */
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "item %zd is %.100s, not an int", i,
                         Py_TYPE(item)->tp_name);
        }
        return -1;
    }
    /* long may be 64-bit (Linux/macOS) or 32-bit (Windows): test both the
     * long-overflow flag and the int32 range. */
    if (overflow || v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "value %R at index %zd is out of int32 range", item, i);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

/* Loose buffer check: bytes-like (itemsize 1, any format) or a 4-byte signed
 * integer buffer in native or little-endian order.  This rejects the silent
 * corruption cases (float32, uint32, int64, big-endian arrays) without parsing
 * the full struct format grammar. */
static int format_ok(const Py_buffer *v) {
    const char *f = v->format ? v->format : "B";
    if (v->itemsize == 1) return 1;
    if (v->itemsize != 4) return 0;
    if (*f == '<' || *f == '@' || *f == '=') f++;
#if PY_BIG_ENDIAN
    if (f == v->format || f[-1] != '<') return 0; /* native order is big here */
#endif
    return (f[0] == 'i' || f[0] == 'l') && f[1] == '\0'; /* 'l' is 4 bytes on Windows */
}

/* METH_FASTCALL: rows are often short, so the ~50 ns of PyArg_ParseTuple
 * tuple building per call would be visible. */
static PyObject *pack_int32(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *items, *out, *seq;
    Py_ssize_t offset, n, i;
    Py_buffer view;
    if (nargs != 3 && nargs != 4)
        return PyErr_Format(PyExc_TypeError, "pack_int32() takes 3 or 4 arguments (%zd given)",
                            nargs);
    /* Optional floor: token ids are never negative, and checking here costs one compare
     * per value instead of a second pass over the row. */
    long floor = INT32_MIN;
    if (nargs == 4) {
        floor = PyLong_AsLong(args[3]);
        if (floor == -1 && PyErr_Occurred()) return NULL;
    }
    items = args[0];
    out = args[1];
    offset = PyNumber_AsSsize_t(args[2], NULL); /* NULL: clamp, so huge -> "too small" */
    if (offset == -1 && PyErr_Occurred()) return NULL;
    if (offset < 0) return PyErr_Format(PyExc_ValueError, "offset must be >= 0, got %zd", offset);
    /* PySequence_Fast returns lists/tuples as-is (new ref), so the hot path
     * reads the item pointer array directly instead of calling __getitem__. */
    seq = PySequence_Fast(items, "pack_int32: items must be a sequence of ints");
    if (seq == NULL) return NULL;
    /* PyBUF_C_CONTIGUOUS makes non-contiguous exporters fail up front (numpy:
     * ValueError, others: BufferError), so plain pointer arithmetic is valid.
     * Holding the view also stops bytearray/ndarray resizes while we write. */
    if (PyObject_GetBuffer(out, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        Py_DECREF(seq);
        return NULL;
    }
    n = PySequence_Fast_GET_SIZE(seq);
    if (!format_ok(&view)) {
        PyErr_Format(PyExc_ValueError, "out must be an int32 or byte buffer, got format '%s' "
                     "with itemsize %zd", view.format ? view.format : "B", view.itemsize);
        goto fail;
    }
    if (view.len / 4 < offset || view.len / 4 - offset < n) { /* overflow-safe form */
        PyErr_Format(PyExc_ValueError, "out too small: need %zd int32 slots from offset %zd, "
                     "buffer holds %zd", n, offset, view.len / 4);
        goto fail;
    }
    PyObject **src = PySequence_Fast_ITEMS(seq);
    unsigned char *dst = (unsigned char *)view.buf + (size_t)offset * 4;
    for (i = 0; i < n; i++) {
        int32_t c;
        if (!compact_value(src[i], &c)) {
            PyObject *item = src[i];
            Py_INCREF(item);
            int rc = slow_value(item, i, &c);
            Py_DECREF(item);
            if (rc < 0) goto fail;
            /* __index__ may have resized the list: re-read, never run past it. */
            if (PySequence_Fast_GET_SIZE(seq) != n) {
                PyErr_SetString(PyExc_RuntimeError, "pack_int32: items changed size");
                goto fail;
            }
            src = PySequence_Fast_ITEMS(seq);
        }
        if (c < floor) {
            PyErr_Format(PyExc_ValueError, "value %d at index %zd is below %ld", (int)c, i, floor);
            goto fail;
        }
        uint32_t u = (uint32_t)c;
#if PY_BIG_ENDIAN
        u = __builtin_bswap32(u); /* the output format is little-endian everywhere */
#endif
        memcpy(dst + i * 4, &u, 4); /* memcpy: out may be unaligned (bytearray slice) */
    }
    PyBuffer_Release(&view);
    Py_DECREF(seq);
    return PyLong_FromSsize_t(n);
fail:
    PyBuffer_Release(&view);
    Py_DECREF(seq);
    return NULL;
}

static PyMethodDef methods[] = {
    {"pack_int32", (PyCFunction)(void (*)(void))pack_int32, METH_FASTCALL,
     "pack_int32(items, out, offset[, floor]) -> int\n\nWrite items as little-endian int32 into "
     "the writable buffer out, starting at int32 element index offset; return the count. "
     "Values below floor raise ValueError."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT,
    .m_name = "eagle3kit._fastints",
    .m_doc = "Fast list[int] -> int32 buffer packing (optional accelerator).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fastints(void) { return PyModule_Create(&moduledef); }
