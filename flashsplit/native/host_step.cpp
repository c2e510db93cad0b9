// The native host step of flashsplit.decode(): one call of an already-prepared decode
// signature, checked and launched without running Python bytecode.
//
// A HostStep holds the static facts of one call signature (each tensor argument's shape, strides,
// dtype, device, address mod 16 and negation bit, which optional tensors are given, the options
// and their types) and its launches: for each, a host function `void fn(void**)`, its packed
// argument array, the block of 8-byte per-call slots that array points into, the slot of the
// CUDA result the function writes, and where each per-call slot's value comes from (a tensor's
// address, the stream's workspace or arrival counters plus an offset, the stream, a constant).
// CuTe kernels come with compiled host functions; Triton kernels launch through
// flashsplit_driver_launch (cuLaunchKernelEx on parameters packed once).
//
// step(*args) returns the output (or (out, lse)) after launching, or None where the call is not
// one it can take (any fact, option or type differs, a CUDA graph is being captured, scratch is
// transient, the stream has no large enough workspace yet where the launches need one; for
// Triton's, a launch hook is set: the program's capture probe says so): the caller then runs the Python
// path, which validates and explains. It reads the same Python state the Python eager path
// reads (the raw-stream and capture functions, the workspace and counter dicts, the transient
// flag), so the two never disagree. The GIL is held throughout: launches of one step never
// overlap, and its slots need no lock.

#include <Python.h>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kTensors = 16;  // flashsplit.call.DecodeTensors' fields, in order
constexpr int kOut = 3, kLse = 4, kSeqlens = 5, kTable = 6;
constexpr int kOptions = 8;   // flashsplit.call.DecodeOptions' fields, in order
constexpr int kWindow = 4;    // the window_size option (a tuple)

// The call's arguments, in flashsplit.native.STEP_ARGS order.
enum Arg {
  A_Q, A_K, A_V, A_OUT, A_SEQLENS, A_TABLE, A_PAGE_TABLE, A_K_DESCALE, A_V_DESCALE, A_SINKS,
  A_K_NEW, A_V_NEW, A_ROT_COS, A_ROT_SIN, A_BATCH_IDX, A_LEFTPAD, A_RETURN_LSE, A_OPTIONS,
  kArgs = A_OPTIONS + kOptions
};

// Where each tensor field comes from among the call's arguments (-1: out/lse, made here).
constexpr std::array<int, kTensors> kFieldArg = {
    A_Q, A_K, A_V, -1, -1, A_SEQLENS, A_TABLE, A_K_DESCALE, A_V_DESCALE, A_SINKS,
    A_K_NEW, A_V_NEW, A_ROT_COS, A_ROT_SIN, A_BATCH_IDX, A_LEFTPAD};

enum SourceKind { S_CONST = 0, S_TENSOR = 1, S_WORKSPACE = 2, S_COUNTERS = 3, S_STREAM = 4 };

struct Source {
  int kind;
  int index;       // S_TENSOR: the DecodeTensors field
  int64_t offset;  // added to the address; S_CONST: the value
};

struct Launch {
  void (*fn)(void**);
  void** packed;
  uint64_t* slots;   // the per-call slots, 8 bytes each, in argument order
  int32_t* result;   // the CUDA result the host function writes (0: success)
  std::vector<Source> sources;
};

struct Facts {
  bool present = false;
  std::vector<int64_t> sizes, strides;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  uintptr_t residue = 0;
  bool neg = false;
};

struct HostStep {
  PyObject_HEAD
  vectorcallfunc vectorcall;  // step_call: what Python calls
  std::array<Facts, kTensors> facts;
  bool with_lse;
  PyObject* options;       // tuple of the expected option values
  PyObject* state;         // (device index, raw_stream, capturing, scratch, workspaces, counters, raise_cuda)
  PyObject* keep;          // what the packed arrays point into
  int64_t workspace_numel;
  int64_t counter_count;   // 0: no counters read
  std::vector<Launch> launches;
  uint64_t calls;          // launches made (a test reads it)
};

Facts read_facts(const at::Tensor& t) {
  Facts f;
  f.present = true;
  f.sizes = t.sizes().vec();
  f.strides = t.strides().vec();
  f.dtype = t.scalar_type();
  f.device = t.device();
  f.residue = reinterpret_cast<uintptr_t>(t.data_ptr()) & 15;
  f.neg = t.is_neg();
  return f;
}

// Whether `obj` is an exact torch.Tensor (no subclass) with the recorded facts. May throw
// c10::Error (a tensor without storage): the caller declines.
bool matches(PyObject* obj, const Facts& f) {
  if (obj == Py_None) return !f.present;
  // torch.Tensor itself (THPVariable_CheckExact also admits Parameter): as the Python key.
  if (!f.present || Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (t.layout() != c10::kStrided || t.is_nested() || t.device() != f.device || t.scalar_type() != f.dtype)
    return false;
  if (t.sizes() != c10::IntArrayRef(f.sizes) || t.strides() != c10::IntArrayRef(f.strides)) return false;
  return (reinterpret_cast<uintptr_t>(t.data_ptr()) & 15) == f.residue && t.is_neg() == f.neg;
}

// Same type and equal (a tuple: element by element, so True and 1 differ).
bool same_option(PyObject* given, PyObject* expected) {
  if (given == expected) return true;
  if (Py_TYPE(given) != Py_TYPE(expected)) return false;
  if (PyTuple_CheckExact(given)) {
    Py_ssize_t n = PyTuple_GET_SIZE(given);
    if (n != PyTuple_GET_SIZE(expected)) return false;
    for (Py_ssize_t i = 0; i < n; ++i)
      if (!same_option(PyTuple_GET_ITEM(given, i), PyTuple_GET_ITEM(expected, i))) return false;
    return true;
  }
  int eq = PyObject_RichCompareBool(given, expected, Py_EQ);
  if (eq < 0) {
    PyErr_Clear();
    return false;
  }
  return eq == 1;
}

// (size, address) of `table[(index, stream)]` (the per-stream workspace / counters), or false.
bool stream_entry(PyObject* table, PyObject* key, int64_t* size, int64_t* address) {
  PyObject* entry = PyDict_GetItemWithError(table, key);  // borrowed
  if (entry == nullptr || !PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 2) return false;
  *size = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 0));
  *address = static_cast<int64_t>(PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(entry, 1)));
  return !PyErr_Occurred();
}

PyObject* decline() {
  PyErr_Clear();
  Py_RETURN_NONE;
}

PyObject* step_call(PyObject* self_obj, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  auto* self = reinterpret_cast<HostStep*>(self_obj);
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || nargs != kArgs) {
    PyErr_Format(PyExc_TypeError, "HostStep: expected %d positional arguments, got %zd", (int)kArgs, nargs);
    return nullptr;
  }
  // The options and the outputs asked for.
  if (args[A_RETURN_LSE] != (self->with_lse ? Py_True : Py_False) || args[A_OUT] != Py_None) return decline();
  for (int i = 0; i < kOptions; ++i)
    if (!same_option(args[A_OPTIONS + i], PyTuple_GET_ITEM(self->options, i))) return decline();
  // page_table is block_table's alias.
  PyObject* fields[kTensors];
  for (int i = 0; i < kTensors; ++i) fields[i] = kFieldArg[i] < 0 ? Py_None : args[kFieldArg[i]];
  if (args[A_PAGE_TABLE] != Py_None) {
    if (args[A_TABLE] != Py_None) return decline();
    fields[kTable] = args[A_PAGE_TABLE];
  }
  try {
    for (int i = 0; i < kTensors; ++i)
      if (i != kOut && i != kLse && !matches(fields[i], self->facts[i])) return decline();
  } catch (const std::exception&) {
    return decline();
  }
  // The state the Python eager path reads: transient scratch, capture, the stream's buffers.
  PyObject* state = self->state;
  PyObject* device_index = PyTuple_GET_ITEM(state, 0);
  PyObject* transient = PyObject_GetAttrString(PyTuple_GET_ITEM(state, 3), "transient");
  if (transient == nullptr) return decline();
  Py_DECREF(transient);
  if (transient != Py_False) return decline();
  PyObject* capturing = PyObject_CallNoArgs(PyTuple_GET_ITEM(state, 2));
  if (capturing == nullptr) return decline();
  Py_DECREF(capturing);
  if (capturing != Py_False) return decline();
  PyObject* stream_obj = PyObject_CallOneArg(PyTuple_GET_ITEM(state, 1), device_index);
  if (stream_obj == nullptr) return decline();
  uint64_t stream = PyLong_AsUnsignedLongLongMask(stream_obj);
  PyObject* key = PyTuple_Pack(2, device_index, stream_obj);
  Py_DECREF(stream_obj);
  if (key == nullptr) return decline();
  int64_t workspace_numel = 0, workspace = 0, counter_count = 0, counters = 0;
  bool ready = (self->workspace_numel == 0 ||
                (stream_entry(PyTuple_GET_ITEM(state, 4), key, &workspace_numel, &workspace) &&
                 workspace_numel >= self->workspace_numel)) &&
               (self->counter_count == 0 ||
                (stream_entry(PyTuple_GET_ITEM(state, 5), key, &counter_count, &counters) &&
                 counter_count >= self->counter_count));
  Py_DECREF(key);
  if (!ready) return decline();
  // The outputs, as flashsplit.decode makes them.
  PyObject* out_obj = nullptr;
  PyObject* lse_obj = nullptr;
  uint64_t field_ptr[kTensors] = {};
  try {
    const at::Tensor& q = THPVariable_Unpack(fields[0]);
    at::Tensor out = at::empty_like(q);
    field_ptr[kOut] = reinterpret_cast<uint64_t>(out.data_ptr());
    out_obj = THPVariable_Wrap(std::move(out));
    if (self->with_lse) {
      at::Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
      field_ptr[kLse] = reinterpret_cast<uint64_t>(lse.data_ptr());
      lse_obj = THPVariable_Wrap(std::move(lse));
    }
    for (int i = 0; i < kTensors; ++i)
      if (i != kOut && i != kLse && fields[i] != Py_None)
        field_ptr[i] = reinterpret_cast<uint64_t>(THPVariable_Unpack(fields[i]).data_ptr());
  } catch (const std::exception& e) {
    Py_XDECREF(out_obj);
    Py_XDECREF(lse_obj);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  if (out_obj == nullptr || (self->with_lse && lse_obj == nullptr)) {
    Py_XDECREF(out_obj);
    Py_XDECREF(lse_obj);
    return nullptr;
  }
  for (Launch& launch : self->launches) {
    uint64_t* slot = launch.slots;
    for (const Source& s : launch.sources) {
      switch (s.kind) {
        case S_TENSOR: *slot++ = field_ptr[s.index] + s.offset; break;
        case S_WORKSPACE: *slot++ = static_cast<uint64_t>(workspace + s.offset); break;
        case S_COUNTERS: *slot++ = static_cast<uint64_t>(counters + s.offset); break;
        case S_STREAM: *slot++ = stream; break;
        default: *slot++ = static_cast<uint64_t>(s.offset); break;
      }
    }
    launch.fn(launch.packed);
    self->calls += 1;
    int32_t rc = *launch.result;
    if (rc != 0) {
      *launch.result = 0;
      Py_DECREF(out_obj);
      Py_XDECREF(lse_obj);
      PyObject* code = PyLong_FromLong(rc);
      PyObject* raised = code ? PyObject_CallOneArg(PyTuple_GET_ITEM(state, 6), code) : nullptr;
      Py_XDECREF(code);
      Py_XDECREF(raised);
      if (!PyErr_Occurred()) PyErr_Format(PyExc_RuntimeError, "CUDA error %d in a decode launch", (int)rc);
      return nullptr;
    }
  }
  if (!self->with_lse) return out_obj;
  PyObject* pair = PyTuple_Pack(2, out_obj, lse_obj);
  Py_DECREF(out_obj);
  Py_DECREF(lse_obj);
  return pair;
}

void step_dealloc(PyObject* self_obj) {
  auto* self = reinterpret_cast<HostStep*>(self_obj);
  Py_XDECREF(self->options);
  Py_XDECREF(self->state);
  Py_XDECREF(self->keep);
  self->facts.~array();
  self->launches.~vector();
  Py_TYPE(self_obj)->tp_free(self_obj);
}

uint64_t as_u64(PyObject* o) { return PyLong_AsUnsignedLongLongMask(o); }

// HostStep(example, with_lse, options, state, workspace_numel, counter_count, launches, keep)
//   example: the 16 DecodeTensors fields of one call of the signature (out/lse ignored)
//   launches: [(fn, packed, slots, result, [(kind, index, offset), ...]), ...]
PyObject* step_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject *example, *with_lse, *options, *state, *launches, *keep;
  long long workspace_numel, counter_count;
  if (!PyArg_ParseTuple(args, "OOOOLLOO", &example, &with_lse, &options, &state, &workspace_numel,
                        &counter_count, &launches, &keep))
    return nullptr;
  if (!PyTuple_Check(example) || PyTuple_GET_SIZE(example) != kTensors) {
    PyErr_Format(PyExc_ValueError, "example: expected a tuple of %d tensors or None", kTensors);
    return nullptr;
  }
  if (!PyTuple_CheckExact(options) || PyTuple_GET_SIZE(options) != kOptions) {
    PyErr_Format(PyExc_ValueError, "options: expected a tuple of %d values", kOptions);
    return nullptr;
  }
  if (!PyTuple_CheckExact(state) || PyTuple_GET_SIZE(state) != 7 || !PyDict_Check(PyTuple_GET_ITEM(state, 4)) ||
      !PyDict_Check(PyTuple_GET_ITEM(state, 5))) {
    PyErr_SetString(PyExc_ValueError,
                    "state: expected (device index, raw_stream, capturing, scratch, workspaces dict, "
                    "counters dict, raise_cuda)");
    return nullptr;
  }
  auto* self = reinterpret_cast<HostStep*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  new (&self->facts) std::array<Facts, kTensors>();
  new (&self->launches) std::vector<Launch>();
  self->with_lse = PyObject_IsTrue(with_lse) == 1;
  self->workspace_numel = workspace_numel;
  self->counter_count = counter_count;
  self->calls = 0;
  self->vectorcall = step_call;
  Py_INCREF(options);
  self->options = options;
  Py_INCREF(state);
  self->state = state;
  Py_INCREF(keep);
  self->keep = keep;
  try {
    for (int i = 0; i < kTensors; ++i) {
      PyObject* t = PyTuple_GET_ITEM(example, i);
      if (i == kOut || i == kLse || t == Py_None) continue;
      if (!THPVariable_Check(t)) {
        PyErr_Format(PyExc_TypeError, "example[%d]: expected a tensor or None", i);
        Py_DECREF(self);
        return nullptr;
      }
      self->facts[i] = read_facts(THPVariable_Unpack(t));
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
    Py_DECREF(self);
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(launches, "launches: expected a sequence");
  if (seq == nullptr) {
    Py_DECREF(self);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    PyObject *fn, *packed, *slots, *result, *sources;
    if (!PyArg_ParseTuple(item, "OOOOO", &fn, &packed, &slots, &result, &sources)) break;
    Launch launch;
    launch.fn = reinterpret_cast<void (*)(void**)>(as_u64(fn));
    launch.packed = reinterpret_cast<void**>(as_u64(packed));
    launch.slots = reinterpret_cast<uint64_t*>(as_u64(slots));
    launch.result = reinterpret_cast<int32_t*>(as_u64(result));
    PyObject* src = PySequence_Fast(sources, "sources: expected a sequence");
    if (src == nullptr) break;
    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(src); ++j) {
      int kind, index;
      long long offset;
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(src, j), "iiL", &kind, &index, &offset)) break;
      if (kind < S_CONST || kind > S_STREAM || (kind == S_TENSOR && (index < 0 || index >= kTensors))) {
        PyErr_Format(PyExc_ValueError, "source %zd of launch %zd: kind %d, index %d", j, i, kind, index);
        break;
      }
      if (kind == S_TENSOR && index != kOut && index != kLse && !self->facts[index].present) {
        PyErr_Format(PyExc_ValueError, "source %zd of launch %zd reads tensor %d, absent in the example", j, i,
                     index);
        break;
      }
      if (kind == S_TENSOR && index == kLse && !self->with_lse) {
        PyErr_SetString(PyExc_ValueError, "a source reads the lse, which this step does not make");
        break;
      }
      launch.sources.push_back({kind, index, static_cast<int64_t>(offset)});
    }
    Py_DECREF(src);
    if (PyErr_Occurred()) break;
    if (launch.fn == nullptr || launch.packed == nullptr || launch.slots == nullptr || launch.result == nullptr) {
      PyErr_Format(PyExc_ValueError, "launch %zd: a null address", i);
      break;
    }
    self->launches.push_back(std::move(launch));
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) {
    Py_DECREF(self);
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(self);
}

PyObject* step_calls(PyObject* self_obj, void*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<HostStep*>(self_obj)->calls);
}

PyGetSetDef step_getset[] = {
    {"calls", step_calls, nullptr, "Host functions this step has called.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject HostStepType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// A host function that does nothing (tests and the call-layer benchmark launch through it).
extern "C" void flashsplit_no_launch(void**) {}

PyObject* no_launch_address(PyObject*, PyObject*) {
  return PyLong_FromVoidPtr(reinterpret_cast<void*>(&flashsplit_no_launch));
}

// CUlaunchConfig's hStream: after gridDim, blockDim (3 x uint32 each), sharedMemBytes and 4
// bytes of padding (checked against the ctypes layout in flashsplit/triton/driver_launch.py).
constexpr size_t kConfigStreamOffset = 32;

// One kernel launch through the CUDA driver, for kernels that have no host function of their
// own (Triton's). packed: [0] cuLaunchKernelEx, [1] the CUfunction, [2] its void* kernelParams[],
// [3] the CUlaunchConfig, [4] the per-call slot that holds the stream, [5] the int32 CUresult.
extern "C" void flashsplit_driver_launch(void** packed) {
  using LaunchKernelEx = int (*)(const void* config, void* function, void** params, void** extra);
  char* config = static_cast<char*>(packed[3]);
  std::memcpy(config + kConfigStreamOffset, packed[4], sizeof(uint64_t));
  *static_cast<int32_t*>(packed[5]) =
      reinterpret_cast<LaunchKernelEx>(packed[0])(config, packed[1], static_cast<void**>(packed[2]), nullptr);
}

PyObject* driver_launch_address(PyObject*, PyObject*) {
  return PyLong_FromVoidPtr(reinterpret_cast<void*>(&flashsplit_driver_launch));
}

PyMethodDef module_methods[] = {
    {"no_launch_address", no_launch_address, METH_NOARGS, "Address of a host function that does nothing."},
    {"driver_launch_address", driver_launch_address, METH_NOARGS,
     "Address of the host function that launches one kernel through cuLaunchKernelEx."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "flashsplit_host_step", "flashsplit's native host step.", -1,
                          module_methods};

}  // namespace

PyMODINIT_FUNC PyInit_flashsplit_host_step(void) {
  HostStepType.tp_name = "flashsplit_host_step.HostStep";
  HostStepType.tp_basicsize = sizeof(HostStep);
  HostStepType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  HostStepType.tp_new = step_new;
  HostStepType.tp_dealloc = step_dealloc;
  HostStepType.tp_call = PyVectorcall_Call;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winvalid-offsetof"
  HostStepType.tp_vectorcall_offset = offsetof(HostStep, vectorcall);
#pragma GCC diagnostic pop
  HostStepType.tp_getset = step_getset;
  HostStepType.tp_doc = "One prepared decode signature's checked, native launch (see host_step.cpp).";
  if (PyType_Ready(&HostStepType) < 0) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  Py_INCREF(&HostStepType);
  if (PyModule_AddObject(module, "HostStep", reinterpret_cast<PyObject*>(&HostStepType)) < 0) {
    Py_DECREF(&HostStepType);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
