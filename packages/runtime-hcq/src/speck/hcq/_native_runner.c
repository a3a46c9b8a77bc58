/* speck.hcq._native_runner: the runner's short route (speck.hcq.runner.run) in one native call.

A plain CPython extension (METH_FASTCALL), not cffi: the hot path is Python-object bookkeeping (the plan's lock, the
batch's bound addresses, the engine's sequence number and busy flag, the counters), which cffi cannot touch. It is
optional: without it (no compiler at install time, or NATIVE_RUNNER=0) runner.run's Python route runs, and that
route is the reference this one is tested against (tests/hcq/test_native_runner.py).

run_short(plan, bufs, var_vals, wait, timing, count) does what runner.run's short route does for a plan that is one
settled batch, in the same order, and returns True; it returns False, having changed nothing, for anything else
(the Python route then runs). The pieces it leaves to Python keep their Python code: Batch.bind / Batch.point, a
graph still choosing its workers (CPUGraph.replay), a busy or profiling engine (Engine.submit), waking waiters
(Signal.set), the hand-over of work queued meanwhile (Engine._after_inline), and wait_idle.

Locks: the plan's lock is really taken (acquire(False), as the Python route does): the graph runs with the GIL
released, so another thread may reach this plan meanwhile. The engine's lock guards a few lines of Python that read
and write its state; here those lines run in C without releasing the GIL, so no Python code of another thread can
interleave with them. If the lock is held (another thread is inside those lines, preempted), the Python code runs
instead and waits for it as Engine.run_inline would. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>

typedef void (*packed_fn)(void *);

#define MAX_FAST_SLOTS 32

static int ready = 0;
static PyTypeObject *buffer_type, *batch_type, *signal_type, *counts_type, *graph_type;
static PyObject *counts, *debug_var, *profile_var, *native_var, *off_values, *graph_module, *two, *one;
/* slot offsets (member descriptors of __slots__ classes) */
static Py_ssize_t buf_base, buf_opaque, buf_addr, buf_addr_of;
static Py_ssize_t b_every, b_hold, b_last, b_graph, b_device, b_kernels, b_ops, b_mem;
static Py_ssize_t sig_mem, sig_waiters;
static Py_ssize_t c_kernel_count, c_global_ops, c_global_mem;
static packed_fn interp_fn = NULL; /* speck_graph_run_packed, read once from graph._packed_addr */
static unsigned long long taken = 0;

static PyObject *s_value, *s_single, *s_lock, *s_profile_attr, *s_workers, *s_nworkers, *s_solo, *s_engine, *s_device,
    *s_elock, *s_busy, *s_eprofile, *s_submitted, *s_timeline, *s_pending, *s_error, *s_after_inline, *s_set,
    *s_wait_idle, *s_replay, *s_bind, *s_point, *s_ptr, *s_acquire, *s_release, *s_locked, *s_submit, *s_submission,
    *s_packed_addr, *s_waiters, *s_base_attr, *s_opaque_attr, *s_addr_of_attr, *s_addr_attr;

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

static int slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out) {
    PyObject *d = PyObject_GetAttrString((PyObject *)type, name);
    if (d == NULL) return -1;
    if (!PyObject_TypeCheck(d, &PyMemberDescr_Type) ||
        ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ member", type->tp_name, name);
        Py_DECREF(d);
        return -1;
    }
    *out = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return 0;
}

/* obj.name() / obj.name(arg): a method call by interned name */
static PyObject *call0(PyObject *obj, PyObject *name) {
    PyObject *args[1] = {obj};
    return PyObject_VectorcallMethod(name, args, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

static PyObject *call1(PyObject *obj, PyObject *name, PyObject *arg) {
    PyObject *args[2] = {obj, arg};
    return PyObject_VectorcallMethod(name, args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* _thread.lock's methods, called without looking them up (for an exact lock; else by name) */
static PyTypeObject *lock_type;
static PyObject *lock_locked, *lock_acquire, *lock_release;

static PyObject *lock_call(PyObject *lock, PyObject *descr, PyObject *name, PyObject *arg) {
    PyObject *args[2] = {lock, arg};
    Py_ssize_t n = arg == NULL ? 1 : 2;
    if (Py_TYPE(lock) == lock_type) return PyObject_Vectorcall(descr, args, n, NULL);
    return PyObject_VectorcallMethod(name, args, n | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* a call whose result is dropped: 0, or -1 with the error set */
static int done(PyObject *r) {
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* truthiness of obj.name: 1, 0, or -1 with the error set */
static int attr_true(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}




/* runner.run's `x._addr if x._base is None and (o := x._opaque) is not None and o is x._addr_of else x.ptr` by
   attribute (a subclass of Buffer, or something else: the same reads, so the same errors) */
static PyObject *addr_of(PyObject *x) {
    PyObject *base = PyObject_GetAttr(x, s_base_attr), *o = NULL, *of = NULL, *a = NULL;
    if (base == NULL) return NULL;
    int fast = base == Py_None;
    Py_DECREF(base);
    if (fast) {
        if ((o = PyObject_GetAttr(x, s_opaque_attr)) == NULL) return NULL;
        fast = o != Py_None;
    }
    if (fast) {
        if ((of = PyObject_GetAttr(x, s_addr_of_attr)) == NULL) goto out;
        fast = o == of;
    }
    a = PyObject_GetAttr(x, fast ? s_addr_attr : s_ptr);
out:
    Py_XDECREF(o);
    Py_XDECREF(of);
    return a;
}

/* runner.run's short-route binding: the slots' addresses against the table's (Batch.point on a change), or
   Batch.bind for a batch that holds its buffers or whose slots are not the whole list. 0, or -1 with the error set */
static int bind(PyObject *b, PyObject *bufs) {
    int every = PyObject_IsTrue(SLOT(b, b_every));
    if (every < 0) return -1;
    int hold = every ? PyObject_IsTrue(SLOT(b, b_hold)) : 1;
    if (hold < 0) return -1;
    if (!every || hold || !(PyList_CheckExact(bufs) || PyTuple_CheckExact(bufs)) ||
        PySequence_Fast_GET_SIZE(bufs) > MAX_FAST_SLOTS)
        return done(call1(b, s_bind, bufs));
    Py_ssize_t n = PySequence_Fast_GET_SIZE(bufs);
    PyObject *cur[MAX_FAST_SLOTS];
    Py_ssize_t i, got = 0;
    int rc = -1;
    for (i = 0; i < n; i++) {
        PyObject *x = PySequence_Fast_GET_ITEM(bufs, i), *a, *o;
        /* (Buffer.ptr's own test: a whole buffer whose address is known for its allocation) */
        if (Py_TYPE(x) == buffer_type && SLOT(x, buf_base) == Py_None && (o = SLOT(x, buf_opaque)) != NULL &&
            o != Py_None && o == SLOT(x, buf_addr_of) && (a = SLOT(x, buf_addr)) != NULL) {
            Py_INCREF(a);
        } else if ((a = addr_of(x)) == NULL) {
            goto out;
        }
        cur[got++] = a;
    }
    PyObject *last = SLOT(b, b_last);
    int same = last != NULL && PyList_CheckExact(last) && PyList_GET_SIZE(last) == n;
    for (i = 0; same && i < n; i++) {
        /* (the list comparison's items, identity first) */
        int eq = PyObject_RichCompareBool(cur[i], PyList_GET_ITEM(last, i), Py_EQ);
        if (eq < 0) goto out;
        same = eq;
    }
    if (same) {
        rc = 0;
        goto out;
    }
    PyObject *list = PyList_New(n);
    if (list == NULL) goto out;
    for (i = 0; i < n; i++) PyList_SET_ITEM(list, i, cur[i]); /* (the list takes the references) */
    got = 0;
    rc = done(call1(b, s_point, list));
    Py_DECREF(list);
out:
    for (i = 0; i < got; i++) Py_DECREF(cur[i]);
    return rc;
}

/* The last graph replayed (a weak reference: the cache keeps no graph alive), its engine, the engine's lock and
   timeline and the timeline's first word: each is set once, in its owner's __init__, so the cache holds while the
   graph lives. */
static PyObject *last_graph, *last_engine, *last_lock, *last_tl, *last_mem;
static uint64_t *last_word;

static void forget_graph(void) {
    Py_CLEAR(last_graph);
    Py_CLEAR(last_engine);
    Py_CLEAR(last_lock);
    Py_CLEAR(last_tl);
    Py_CLEAR(last_mem);
    last_word = NULL;
}

/* 1: the cache is g's; 0: g's engine is not one this route handles (the method runs); -1: error */
static int cache_graph(PyObject *g) {
    if (last_graph != NULL && PyWeakref_GET_OBJECT(last_graph) == g) return 1;
    forget_graph();
    PyObject *e = PyObject_GetAttr(g, s_engine), *lock = NULL, *tl = NULL, *mem = NULL;
    if (e == NULL || (lock = PyObject_GetAttr(e, s_elock)) == NULL || (tl = PyObject_GetAttr(e, s_timeline)) == NULL)
        goto fail;
    if (Py_TYPE(tl) != signal_type || Py_TYPE(lock) != lock_type || (mem = SLOT(tl, sig_mem)) == NULL) {
        Py_DECREF(e);
        Py_DECREF(lock);
        Py_DECREF(tl);
        return 0;
    }
    Py_INCREF(mem);
    Py_buffer view;
    if (PyObject_GetBuffer(mem, &view, PyBUF_WRITABLE) < 0) goto fail;
    if (view.len < 8) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "a timeline's memory holds fewer than 8 bytes");
        goto fail;
    }
    last_word = (uint64_t *)view.buf; /* (a ctypes array's memory stays where it is while the array lives) */
    PyBuffer_Release(&view);
    if ((last_graph = PyWeakref_NewRef(g, NULL)) == NULL) goto fail;
    last_engine = e;
    last_lock = lock;
    last_tl = tl;
    last_mem = mem;
    return 1;
fail:
    Py_XDECREF(e);
    Py_XDECREF(lock);
    Py_XDECREF(tl);
    Py_XDECREF(mem);
    forget_graph();
    return -1;
}

/* Engine.run_inline(fn, solo) for an engine whose lock is free (checked by the caller, GIL held): 1 ran, 0 busy or
   profiling (nothing done), -1 error */
static int run_inline(PyObject *e, PyObject *lock, PyObject *tl, uint64_t *word, void *solo) {
    int busy = attr_true(e, s_busy);
    if (busy != 0) return busy < 0 ? -1 : 0;
    int prof = attr_true(e, s_eprofile);
    if (prof != 0) return prof < 0 ? -1 : 0;
    PyObject *sub = PyObject_GetAttr(e, s_submitted);
    if (sub == NULL) return -1;
    PyObject *seq = PyNumber_Add(sub, one);
    Py_DECREF(sub);
    if (seq == NULL) return -1;
    int rc = -1;
    uint64_t seqv = PyLong_AsUnsignedLongLong(seq);
    if (seqv == (uint64_t)-1 && PyErr_Occurred()) goto out;
    if (PyObject_SetAttr(e, s_submitted, seq) < 0 || PyObject_SetAttr(e, s_busy, Py_True) < 0) goto out;
    /* (the GIL is released around the graph, as a ctypes call releases it) */
    Py_BEGIN_ALLOW_THREADS
    interp_fn(solo);
    Py_END_ALLOW_THREADS
    *word = seqv; /* (Signal.set inlined, as run_inline does: seq only grows; set() wakes the waiters there are) */
    PyObject *waiters = SLOT(tl, sig_waiters);
    int w = waiters == NULL ? attr_true(tl, s_waiters) : PyObject_IsTrue(waiters);
    if (w > 0) w = done(call1(tl, s_set, seq));
    if (w < 0) goto out;
    /* the lock again: free (the usual case) -> the check under the GIL; held -> wait for it as Python would */
    PyObject *lk = lock_call(lock, lock_locked, s_locked, NULL);
    if (lk == NULL) goto out;
    int held = PyObject_IsTrue(lk);
    Py_DECREF(lk);
    if (held < 0) goto out;
    if (held && done(lock_call(lock, lock_acquire, s_acquire, NULL)) < 0) goto out;
    PyObject *pending = PyObject_GetAttr(e, s_pending);
    Py_ssize_t np = pending == NULL ? -1 : PyObject_Length(pending);
    Py_XDECREF(pending);
    if (np == 0 && PyObject_SetAttr(e, s_busy, Py_False) < 0) np = -1;
    if (held) {
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        int r = done(lock_call(lock, lock_release, s_release, NULL));
        if (et != NULL) PyErr_Restore(et, ev, tb);
        if (r < 0 && np >= 0) np = -1;
    }
    if (np < 0) goto out;
    rc = np == 0 ? 1 : (done(call1(e, s_after_inline, Py_None)) < 0 ? -1 : 1);
out:
    Py_DECREF(seq);
    return rc;
}

/* CPUGraph.replay for a graph settled on worker 0 alone, else the method itself: 0, or -1 with the error set */
static int replay(PyObject *g) {
    if (Py_TYPE(g) != graph_type) return done(call0(g, s_replay));
    PyObject *workers = PyObject_GetAttr(g, s_workers);
    if (workers == NULL) return -1;
    int choosing = workers == Py_None;
    Py_DECREF(workers);
    if (choosing) {
        PyObject *nw = PyObject_GetAttr(g, s_nworkers);
        if (nw == NULL) return -1;
        choosing = PyObject_RichCompareBool(nw, one, Py_GT);
        Py_DECREF(nw);
        if (choosing < 0) return -1;
    }
    if (choosing) return done(call0(g, s_replay));
    PyObject *solo = PyObject_GetAttr(g, s_solo), *e = NULL, *lock = NULL, *tl = NULL, *mem = NULL;
    if (solo == NULL) return -1;
    int rc = -1, t = PyObject_IsTrue(solo);
    if (t <= 0) { /* (not settled on worker 0 alone: the method's own route) */
        rc = t < 0 ? -1 : done(call0(g, s_replay));
        goto out;
    }
    if (interp_fn == NULL) {
        PyObject *addr = PyObject_GetAttr(graph_module, s_packed_addr);
        if (addr == NULL) goto out;
        interp_fn = (packed_fn)PyLong_AsVoidPtr(addr);
        Py_DECREF(addr);
        if (interp_fn == NULL) {
            if (PyErr_Occurred()) goto out;
            rc = done(call0(g, s_replay));
            goto out;
        }
    }
    void *arg = PyLong_AsVoidPtr(solo);
    if (arg == NULL && PyErr_Occurred()) goto out;
    if ((t = cache_graph(g)) <= 0) {
        rc = t < 0 ? -1 : done(call0(g, s_replay));
        goto out;
    }
    /* (this call's own references: other threads replace the cache while the graph runs without the GIL) */
    e = Py_NewRef(last_engine);
    lock = Py_NewRef(last_lock);
    tl = Py_NewRef(last_tl);
    mem = Py_NewRef(last_mem);
    uint64_t *word = last_word;
    PyObject *lk = lock_call(lock, lock_locked, s_locked, NULL);
    if (lk == NULL) goto out;
    int held = PyObject_IsTrue(lk);
    Py_DECREF(lk);
    if (held) { /* another thread is inside the engine's locked lines: the Python route waits for it */
        rc = held < 0 ? -1 : done(call0(g, s_replay));
        goto out;
    }
    int ran = run_inline(e, lock, tl, word, arg);
    if (ran < 0) goto out;
    if (ran == 0) { /* busy or profiling: replay's e.submit(self._submission) */
        PyObject *sub = PyObject_GetAttr(g, s_submission);
        if (sub == NULL) goto out;
        int r = done(call1(e, s_submit, sub));
        Py_DECREF(sub);
        if (r < 0) goto out;
    }
    /* queued behind other work, or an error latched: wait for the device */
    PyObject *sub = PyObject_GetAttr(e, s_submitted);
    if (sub == NULL) goto out;
    PyObject *nowobj = PyLong_FromUnsignedLongLong(*word);
    int behind = nowobj == NULL ? -1 : PyObject_RichCompareBool(nowobj, sub, Py_LT);
    Py_XDECREF(nowobj);
    Py_DECREF(sub);
    if (behind < 0) goto out;
    if (!behind) {
        PyObject *err = PyObject_GetAttr(e, s_error);
        if (err == NULL) goto out;
        behind = err != Py_None;
        Py_DECREF(err);
    }
    if (behind) {
        PyObject *dev = PyObject_GetAttr(g, s_device);
        if (dev == NULL) goto out;
        int r = done(call0(dev, s_wait_idle));
        Py_DECREF(dev);
        if (r < 0) goto out;
    }
    rc = 0;
out:
    Py_DECREF(solo);
    Py_XDECREF(e);
    Py_XDECREF(lock);
    Py_XDECREF(tl);
    Py_XDECREF(mem);
    return rc;
}

static int add_count(Py_ssize_t off, PyObject *v) {
    PyObject *old = SLOT(counts, off);
    if (old == NULL) {
        PyErr_SetString(PyExc_AttributeError, "a run counter is unset");
        return -1;
    }
    PyObject *sum = PyNumber_InPlaceAdd(old, v);
    if (sum == NULL) return -1;
    SLOT(counts, off) = sum;
    Py_DECREF(old);
    return 0;
}

static PyObject *run_short(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "run_short takes (plan, bufs, var_vals, wait, timing, count), got %zd arguments",
                     nargs);
        return NULL;
    }
    if (!ready) Py_RETURN_FALSE;
    PyObject *plan = args[0], *bufs = args[1];
    int t = attr_true(native_var, s_value);
    if (t <= 0) return t < 0 ? NULL : Py_NewRef(Py_False);
    PyObject *b = PyObject_GetAttr(plan, s_single);
    if (b == NULL) return NULL;
    PyObject *lock = NULL, *res = NULL;
    if (Py_TYPE(b) != batch_type) goto no; /* (None: no single batch) */
    if (SLOT(b, b_every) == NULL || SLOT(b, b_hold) == NULL || SLOT(b, b_graph) == NULL || SLOT(b, b_device) == NULL ||
        SLOT(b, b_kernels) == NULL || SLOT(b, b_ops) == NULL || SLOT(b, b_mem) == NULL)
        goto no; /* (a batch missing an attribute: the Python route raises what it raises) */
    /* not var_vals and wait and not timing and count */
    if ((t = PyObject_IsTrue(args[2])) != 0) goto no_or_err;
    if ((t = PyObject_IsTrue(args[3])) != 1) goto no_or_err;
    if ((t = PyObject_IsTrue(args[4])) != 0) goto no_or_err;
    if ((t = PyObject_IsTrue(args[5])) != 1) goto no_or_err;
    PyObject *v = PyObject_GetAttr(debug_var, s_value);
    if (v == NULL) goto err;
    t = PyObject_RichCompareBool(v, two, Py_LT);
    Py_DECREF(v);
    if (t != 1) goto no_or_err;
    PyObject *dev = SLOT(b, b_device);
    if (dev == NULL || (t = attr_true(dev, s_profile_attr)) != 0) goto no_or_err;
    if ((v = PyObject_GetAttr(profile_var, s_value)) == NULL) goto err;
    t = PySequence_Contains(off_values, v);
    Py_DECREF(v);
    if (t != 1) goto no_or_err;
    /* the plan's lock, as the Python route takes it (another thread running this plan: the Python route) */
    if ((lock = PyObject_GetAttr(plan, s_lock)) == NULL) goto err;
    PyObject *got = lock_call(lock, lock_acquire, s_acquire, Py_False);
    if (got == NULL) goto err;
    t = PyObject_IsTrue(got);
    Py_DECREF(got);
    if (t != 1) goto no_or_err;
    PyObject *g;
    int rc = bind(b, bufs);
    if (rc == 0) {
        g = SLOT(b, b_graph);
        if (g == NULL) {
            PyErr_SetString(PyExc_AttributeError, "a batch without a graph on the short route");
            rc = -1;
        } else {
            Py_INCREF(g);
            rc = replay(g);
            Py_DECREF(g);
        }
    }
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    int r = done(lock_call(lock, lock_release, s_release, NULL));
    if (et != NULL) PyErr_Restore(et, ev, tb);
    if (rc < 0 || r < 0) goto err;
    /* count_run(b.kernels, 0, b.ops, b.mem) */
    if (add_count(c_kernel_count, SLOT(b, b_kernels)) < 0 || add_count(c_global_ops, SLOT(b, b_ops)) < 0 ||
        add_count(c_global_mem, SLOT(b, b_mem)) < 0)
        goto err;
    taken++;
    res = Py_NewRef(Py_True);
    goto out;
no_or_err:
    if (t < 0) goto err;
no:
    res = Py_NewRef(Py_False);
    goto out;
err:
    res = NULL;
out:
    Py_DECREF(b);
    Py_XDECREF(lock);
    return res;
}

static PyObject *setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "setup takes (Buffer, Batch, Signal, COUNTS, CPUGraph, graph module, DEBUG, "
                                         "PROFILE, NATIVE_RUNNER, the PROFILE values that record nothing, 2)");
        return NULL;
    }
    for (int i = 0; i < 5; i++)
        if (i != 3 && !PyType_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "setup's argument %d must be a class", i);
            return NULL;
        }
    ready = 0;
    buffer_type = (PyTypeObject *)Py_NewRef(args[0]);
    batch_type = (PyTypeObject *)Py_NewRef(args[1]);
    signal_type = (PyTypeObject *)Py_NewRef(args[2]);
    counts = Py_NewRef(args[3]);
    counts_type = Py_TYPE(counts);
    graph_type = (PyTypeObject *)Py_NewRef(args[4]);
    graph_module = Py_NewRef(args[5]);
    debug_var = Py_NewRef(args[6]);
    profile_var = Py_NewRef(args[7]);
    native_var = Py_NewRef(args[8]);
    off_values = Py_NewRef(args[9]);
    two = Py_NewRef(args[10]);
    interp_fn = NULL;
    if (slot_offset(buffer_type, "_base", &buf_base) < 0 || slot_offset(buffer_type, "_opaque", &buf_opaque) < 0 ||
        slot_offset(buffer_type, "_addr", &buf_addr) < 0 || slot_offset(buffer_type, "_addr_of", &buf_addr_of) < 0 ||
        slot_offset(batch_type, "every", &b_every) < 0 || slot_offset(batch_type, "hold", &b_hold) < 0 ||
        slot_offset(batch_type, "last", &b_last) < 0 || slot_offset(batch_type, "graph", &b_graph) < 0 ||
        slot_offset(batch_type, "device", &b_device) < 0 || slot_offset(batch_type, "kernels", &b_kernels) < 0 ||
        slot_offset(batch_type, "ops", &b_ops) < 0 || slot_offset(batch_type, "mem", &b_mem) < 0 ||
        slot_offset(signal_type, "mem", &sig_mem) < 0 || slot_offset(signal_type, "_waiters", &sig_waiters) < 0 ||
        slot_offset(counts_type, "kernel_count", &c_kernel_count) < 0 ||
        slot_offset(counts_type, "global_ops", &c_global_ops) < 0 ||
        slot_offset(counts_type, "global_mem", &c_global_mem) < 0)
        return NULL;
    PyObject *thread = PyImport_ImportModule("_thread");
    if (thread == NULL) return NULL;
    Py_XDECREF(lock_type);
    lock_type = (PyTypeObject *)PyObject_GetAttrString(thread, "LockType");
    Py_DECREF(thread);
    if (lock_type == NULL) return NULL;
    Py_XSETREF(lock_locked, PyObject_GetAttr((PyObject *)lock_type, s_locked));
    Py_XSETREF(lock_acquire, PyObject_GetAttr((PyObject *)lock_type, s_acquire));
    Py_XSETREF(lock_release, PyObject_GetAttr((PyObject *)lock_type, s_release));
    if (lock_locked == NULL || lock_acquire == NULL || lock_release == NULL) return NULL;
    forget_graph();
    ready = 1;
    Py_RETURN_NONE;
}

static PyObject *taken_count(PyObject *self, PyObject *unused) { return PyLong_FromUnsignedLongLong(taken); }

static PyMethodDef methods[] = {
    {"run_short", (PyCFunction)(void (*)(void))run_short, METH_FASTCALL,
     "run_short(plan, bufs, var_vals, wait, timing, count) -> bool: runner.run's short route; False: not taken"},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, "bind the classes and settings run_short reads"},
    {"taken", taken_count, METH_NOARGS, "how many runs run_short has taken"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native_runner", NULL, -1, methods};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__native_runner(void) {
    if (one == NULL && (one = PyLong_FromLong(1)) == NULL) return NULL;
    INTERN(s_value, "value");
    INTERN(s_single, "single");
    INTERN(s_lock, "lock");
    INTERN(s_profile_attr, "_profile");
    INTERN(s_workers, "workers");
    INTERN(s_nworkers, "nworkers");
    INTERN(s_solo, "_solo");
    INTERN(s_engine, "_engine");
    INTERN(s_device, "device");
    INTERN(s_elock, "_lock");
    INTERN(s_busy, "_busy");
    INTERN(s_eprofile, "profile");
    INTERN(s_submitted, "submitted");
    INTERN(s_timeline, "timeline");
    INTERN(s_pending, "_pending");
    INTERN(s_error, "error");
    INTERN(s_after_inline, "_after_inline");
    INTERN(s_set, "set");
    INTERN(s_wait_idle, "wait_idle");
    INTERN(s_replay, "replay");
    INTERN(s_bind, "bind");
    INTERN(s_point, "point");
    INTERN(s_ptr, "ptr");
    INTERN(s_acquire, "acquire");
    INTERN(s_release, "release");
    INTERN(s_locked, "locked");
    INTERN(s_submit, "submit");
    INTERN(s_submission, "_submission");
    INTERN(s_packed_addr, "_packed_addr");
    INTERN(s_waiters, "_waiters");
    INTERN(s_base_attr, "_base");
    INTERN(s_opaque_attr, "_opaque");
    INTERN(s_addr_of_attr, "_addr_of");
    INTERN(s_addr_attr, "_addr");
    return PyModule_Create(&module);
}
