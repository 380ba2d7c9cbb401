/* Decode only the rows and columns of a JPEG that a crop reads (libjpeg-turbo partial decoding).
 *
 * decode_region(data, scale_num, x, y, w, h, out, stride) -> (x_start, width)
 *
 * Decodes the image at scale scale_num/8 as RGB, but only output rows [y, y+h) and (at least) columns
 * [x, x+w): rows above y are entropy-decoded and skipped (jpeg_skip_scanlines: no IDCT, no colour
 * conversion), rows below are never read (jpeg_abort_decompress), and columns are cut to whole iMCUs
 * (jpeg_crop_scanline widens the range to x_start <= x, x_start + width >= x + w, which it returns).
 * Pixel (r, c) of the scaled image lands at out[r * stride + c * 3]: ``out`` is laid out as the whole
 * scaled image (stride = its width * 3), so callers index it with full-image coordinates.
 *
 * Any libjpeg error *or warning* raises ValueError; the caller then falls back to its full decoder, so
 * corrupt files keep that decoder's behaviour. The GIL is released while decoding.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    int warned;
    char message[JMSG_LENGTH_MAX];
} ErrorManager;

static void on_error(j_common_ptr cinfo) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    ErrorManager *err = (ErrorManager *)cinfo->err;
    if (level < 0 && !err->warned) { /* a warning: corrupt data libjpeg would paper over */
        err->warned = 1;
        (*cinfo->err->format_message)(cinfo, err->message);
    }
}

enum { OK = 0, FAILED, BAD_REGION, SMALL_BUFFER, WARNED };

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer data, out;
    int scale_num, x, y, w, h;
    Py_ssize_t stride;
    if (!PyArg_ParseTuple(args, "y*iiiiiw*n", &data, &scale_num, &x, &y, &w, &h, &out, &stride))
        return NULL;
    if (scale_num < 1 || scale_num > 8 || x < 0 || y < 0 || w < 1 || h < 1 || stride < 3) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "decode_region: bad arguments");
        return NULL;
    }

    struct jpeg_decompress_struct cinfo;
    ErrorManager err;
    volatile int status = OK;
    JDIMENSION x_start = (JDIMENSION)x, width = (JDIMENSION)w;
    unsigned char *base = (unsigned char *)out.buf;
    Py_ssize_t capacity = out.len;

    memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.warned = 0;
    err.message[0] = '\0';

    Py_BEGIN_ALLOW_THREADS
    if (setjmp(err.jump)) { /* set before jpeg_create_decompress, which can fail too (out of memory) */
        status = FAILED;
    } else {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.out_color_space = JCS_RGB;
        cinfo.scale_num = (unsigned int)scale_num;
        cinfo.scale_denom = 8;
        jpeg_start_decompress(&cinfo);
        if ((JDIMENSION)x + (JDIMENSION)w > cinfo.output_width || (JDIMENSION)y + (JDIMENSION)h > cinfo.output_height ||
            cinfo.output_components != 3 || (Py_ssize_t)cinfo.output_width * 3 > stride) {
            status = BAD_REGION;
        } else if ((Py_ssize_t)(y + h - 1) * stride + (Py_ssize_t)cinfo.output_width * 3 > capacity) {
            status = SMALL_BUFFER;
        } else {
            jpeg_crop_scanline(&cinfo, &x_start, &width);
            if (y > 0)
                jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
            while (cinfo.output_scanline < (JDIMENSION)(y + h)) {
                JSAMPROW row = base + (Py_ssize_t)cinfo.output_scanline * stride + (Py_ssize_t)x_start * 3;
                if (jpeg_read_scanlines(&cinfo, &row, 1) != 1)
                    break;
            }
            if (cinfo.output_scanline < (JDIMENSION)(y + h))
                status = FAILED;
            else if (err.warned)
                status = WARNED;
        }
    }
    jpeg_destroy_decompress(&cinfo); /* also aborts a decode stopped before its last row; a no-op on the
                                        zeroed struct if creation itself failed */
    Py_END_ALLOW_THREADS

    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    switch (status) {
    case OK:
        return Py_BuildValue("(II)", x_start, width);
    case BAD_REGION:
        PyErr_SetString(PyExc_ValueError, "decode_region: region outside the scaled image, or not 3 channels");
        return NULL;
    case SMALL_BUFFER:
        PyErr_SetString(PyExc_ValueError, "decode_region: output buffer too small");
        return NULL;
    default:
        PyErr_Format(PyExc_ValueError, "libjpeg: %s", err.message[0] ? err.message : "decode failed");
        return NULL;
    }
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, scale_num, x, y, w, h, out, stride) -> (x_start, width): decode rows [y, y+h) "
     "and at least columns [x, x+w) of a JPEG at scale_num/8 as RGB into out, laid out as the whole "
     "scaled image with row stride `stride` bytes. ValueError on any libjpeg error or warning."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegregion", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpegregion(void) { return PyModule_Create(&module); }
