/* A C program of NCCL's API, run by tests/integrations/test_nccl_api.py against libpyccl_nccl.so in host mode (no GPU): the
 * calls' argument errors, then WORLD ranks as forked processes that meet through ncclGetUniqueId's id and run
 * every collective on fresh random inputs, each result compared with a float64 reference.
 *
 *   nccl_api_check WORLD SEED
 *
 * Prints "ok" lines and exits 0, or prints what failed and exits 1. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nccl_abi.h"

static int failures = 0;
static int world = 2;
static unsigned seed = 1;

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                        \
      fprintf(stderr, "\n");                               \
      ++failures;                                          \
    }                                                      \
  } while (0)

#define EXPECT(call, want)                                                                                       \
  do {                                                                                                           \
    ncclResult_t got_ = (call);                                                                                  \
    CHECK(got_ == (want), "%s returned %d (%s), expected %d; last error: %s", #call, (int)got_,                 \
          ncclGetErrorString(got_), (int)(want), ncclGetLastError(NULL));                                        \
  } while (0)

/* --- dtypes ------------------------------------------------------------------------------------------------ */

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1); /* round to nearest even */
  return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* Half precision for values of magnitude 2^-14 to 65504 and zero (the tests' range). */
static uint16_t to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000;
  int exp = (int)((u >> 23) & 0xff) - 127 + 15;
  uint32_t mant = u & 0x7fffff;
  if ((u & 0x7fffffff) == 0 || exp <= 0) return (uint16_t)sign;
  uint32_t h = sign | ((uint32_t)exp << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return (uint16_t)h;
}
static float from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u = exp == 0 ? sign : sign | ((uint32_t)(exp - 15 + 127) << 23) | (mant << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static size_t size_of(ncclDataType_t t) { return t == ncclFloat32 ? 4 : 2; }
static void store(ncclDataType_t t, void* buf, size_t i, double v) {
  if (t == ncclFloat32) ((float*)buf)[i] = (float)v;
  else if (t == ncclBfloat16) ((uint16_t*)buf)[i] = to_bf16((float)v);
  else ((uint16_t*)buf)[i] = to_f16((float)v);
}
static double load(ncclDataType_t t, const void* buf, size_t i) {
  if (t == ncclFloat32) return ((const float*)buf)[i];
  if (t == ncclBfloat16) return from_bf16(((const uint16_t*)buf)[i]);
  return from_f16(((const uint16_t*)buf)[i]);
}
static const char* name_of(ncclDataType_t t) {
  return t == ncclFloat32 ? "float32" : t == ncclBfloat16 ? "bfloat16" : "float16";
}
/* Relative tolerance of a sum of `world` values rounded once to the dtype. */
static double tolerance(ncclDataType_t t) { return t == ncclFloat32 ? 1e-5 : t == ncclBfloat16 ? 1.6e-2 : 2e-3; }

/* Rank r's input element i of call `call`: a random value in [-2, 2), as the dtype holds it. Every rank can
 * make every rank's input, so each computes the float64 reference of the whole call itself. */
static double input(ncclDataType_t t, int call, int r, size_t i) {
  uint64_t x = ((uint64_t)seed * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)call << 40) ^ ((uint64_t)r << 32) ^ i;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  double v = (double)(x >> 11) / (double)(1ull << 53) * 4.0 - 2.0;
  char tmp[4];
  store(t, tmp, 0, v);
  return load(t, tmp, 0);
}

static int close_to(double got, double want, double tol) { return fabs(got - want) <= tol * (fabs(want) + 1.0); }

/* --- errors without a communicator --------------------------------------------------------------------------- */

static void check_errors_without_comm(void) {
  int version = 0;
  EXPECT(ncclGetVersion(&version), ncclSuccess);
  CHECK(version >= 21900, "version %d", version);
  EXPECT(ncclGetVersion(NULL), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(NULL), "version") != NULL, "last error names the argument: %s",
        ncclGetLastError(NULL));
  CHECK(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0, "error string of ncclSuccess");
  EXPECT(ncclGetUniqueId(NULL), ncclInvalidArgument);
  ncclUniqueId bad;
  memset(&bad, 7, sizeof(bad));
  ncclComm_t comm = NULL;
  EXPECT(ncclCommInitRank(&comm, 2, bad, 0), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(NULL), "commId") != NULL, "names commId: %s", ncclGetLastError(NULL));
  CHECK(comm == NULL, "no communicator on failure");
  ncclUniqueId id;
  EXPECT(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT(ncclCommInitRankScalable(&comm, 2, 0, 0, &id, NULL), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(NULL), "nId") != NULL, "names nId: %s", ncclGetLastError(NULL));
  EXPECT(ncclCommInitRankScalable(&comm, 2, 0, 1, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT(ncclCommInitRank(NULL, 2, id, 0), ncclInvalidArgument);
  int n = 0;
  EXPECT(ncclCommCount(NULL, &n), ncclInvalidArgument);
  float x = 1;
  EXPECT(ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, NULL, NULL), ncclInvalidArgument);
  EXPECT(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT(ncclCommInitAll(&comm, 2, NULL), ncclInvalidUsage); /* no GPUs: one process per rank */
  printf("ok errors without a communicator\n");
}

/* --- one rank ------------------------------------------------------------------------------------------------ */

static int call_no = 0;

static void check_all_reduce(ncclComm_t comm, int rank, ncclDataType_t t, size_t count, ncclRedOp_t op,
                             int in_place) {
  const int call = ++call_no;
  void* send = calloc(1, count * size_of(t) + 1);
  void* recv = in_place ? send : calloc(1, count * size_of(t) + 1);
  for (size_t i = 0; i < count; ++i) store(t, send, i, input(t, call, rank, i));
  EXPECT(ncclAllReduce(send, recv, count, t, op, comm, NULL), ncclSuccess);
  int bad = 0;
  for (size_t i = 0; i < count && bad < 3; ++i) {
    double want = op == ncclMax ? -1e300 : 0;
    for (int q = 0; q < world; ++q) {
      double v = input(t, call, q, i);
      want = op == ncclMax ? (v > want ? v : want) : want + v;
    }
    if (op == ncclAvg) want /= world;
    double got = load(t, recv, i);
    if (!close_to(got, want, op == ncclMax ? 0 : tolerance(t))) {
      CHECK(0, "all_reduce %s op %d count %zu%s: element %zu is %g, expected %g", name_of(t), (int)op, count,
            in_place ? " in place" : "", i, got, want);
      ++bad;
    }
  }
  free(send);
  if (!in_place) free(recv);
}

/* Rank r's 64 random bits for element i of call `call`. */
static uint64_t bits_of(int call, int r, size_t i) {
  uint64_t x = ((uint64_t)seed * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)call << 40) ^ ((uint64_t)r << 32) ^ i;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 32);
}

/* All-reduce and reduce-scatter of int32 (sum wraps, min as signed), uint8 (max as unsigned), int64 (sum and
 * prod wrap) and float64 (sum in rank order, avg), on values over the whole range: the kernels' results, exact. */
static void check_exact_reductions(ncclComm_t comm, int rank, size_t count) {
  const int call = ++call_no;
  int32_t* i32 = malloc(count * 4);
  uint8_t* u8 = malloc(count);
  int64_t* i64 = malloc(count * 8);
  double* f64 = malloc(count * 8);
  const ncclRedOp_t ops[] = {ncclSum, ncclMin, ncclMax, ncclProd, ncclAvg};
  for (int k = 0; k < 5; ++k) {
    const ncclRedOp_t op = ops[k];
    for (size_t i = 0; i < count; ++i) {
      const uint64_t b = bits_of(call + k, rank, i);
      i32[i] = (int32_t)(uint32_t)b;
      u8[i] = (uint8_t)b;
      i64[i] = (int64_t)b;
      f64[i] = (double)(int64_t)(b >> 11) / 1048576.0 - 1e9;
    }
    EXPECT(ncclAllReduce(i32, i32, count, ncclInt32, op, comm, NULL), ncclSuccess);
    EXPECT(ncclAllReduce(u8, u8, count, ncclUint8, op, comm, NULL), ncclSuccess);
    EXPECT(ncclAllReduce(i64, i64, count, ncclInt64, op, comm, NULL), ncclSuccess);
    EXPECT(ncclAllReduce(f64, f64, count, ncclFloat64, op, comm, NULL), ncclSuccess);
    int bad = 0;
    for (size_t i = 0; i < count && bad < 3; ++i) {
      uint32_t s32 = 0, p32 = 1;
      int32_t min32 = INT32_MAX, max32 = INT32_MIN;
      uint32_t s8 = 0, p8 = 1, min8 = 255, max8 = 0;
      uint64_t s64 = 0, p64 = 1;
      int64_t min64 = INT64_MAX, max64 = INT64_MIN;
      double sf = 0, pf = 1, minf = INFINITY, maxf = -INFINITY;
      for (int q = 0; q < world; ++q) {
        const uint64_t b = bits_of(call + k, q, i);
        const int32_t v32 = (int32_t)(uint32_t)b;
        const uint32_t v8 = (uint8_t)b;
        const int64_t v64 = (int64_t)b;
        const double vf = (double)(int64_t)(b >> 11) / 1048576.0 - 1e9;
        s32 += (uint32_t)v32, p32 *= (uint32_t)v32;
        min32 = v32 < min32 ? v32 : min32, max32 = v32 > max32 ? v32 : max32;
        s8 += v8, p8 *= v8, min8 = v8 < min8 ? v8 : min8, max8 = v8 > max8 ? v8 : max8;
        s64 += (uint64_t)v64, p64 *= (uint64_t)v64;
        min64 = v64 < min64 ? v64 : min64, max64 = v64 > max64 ? v64 : max64;
        sf = q == 0 ? vf : sf + vf, pf = q == 0 ? vf : pf * vf;
        minf = vf < minf ? vf : minf, maxf = vf > maxf ? vf : maxf;
      }
      int64_t w32, w8, w64;
      double wf;
      switch (op) {
        case ncclSum: w32 = (int32_t)s32, w8 = (uint8_t)s8, w64 = (int64_t)s64, wf = sf; break;
        case ncclProd: w32 = (int32_t)p32, w8 = (uint8_t)p8, w64 = (int64_t)p64, wf = pf; break;
        case ncclMin: w32 = min32, w8 = min8, w64 = min64, wf = minf; break;
        case ncclMax: w32 = max32, w8 = max8, w64 = max64, wf = maxf; break;
        default: /* avg: the wrapped sum, divided and truncated toward zero */
          w32 = (int32_t)s32 / world, w8 = (uint8_t)s8 / world, w64 = (int64_t)s64 / world, wf = sf / world;
      }
      if (i32[i] != w32 || u8[i] != w8 || i64[i] != w64 || f64[i] != wf) {
        CHECK(0, "all_reduce op %d count %zu element %zu: int32 %d (want %lld), uint8 %u (%lld), int64 %lld "
              "(%lld), float64 %.17g (%.17g)", (int)op, count, i, i32[i], (long long)w32, u8[i], (long long)w8,
              (long long)i64[i], (long long)w64, f64[i], wf);
        ++bad;
      }
    }
  }
  /* Reduce-scatter of int64 sums: this rank's part of the wrapped whole. */
  const size_t part = count / world;
  int64_t* whole = malloc(part * world * 8);
  int64_t* mine = malloc(part * 8 + 8);
  for (size_t i = 0; i < part * world; ++i) whole[i] = (int64_t)bits_of(call + 9, rank, i);
  EXPECT(ncclReduceScatter(whole, mine, part, ncclInt64, ncclSum, comm, NULL), ncclSuccess);
  for (size_t i = 0; i < part; ++i) {
    uint64_t want = 0;
    for (int q = 0; q < world; ++q) want += bits_of(call + 9, q, rank * part + i);
    if ((uint64_t)mine[i] != want) {
      CHECK(0, "reduce_scatter int64 count %zu element %zu: %lld, expected %lld", part, i, (long long)mine[i],
            (long long)want);
      break;
    }
  }
  free(i32), free(u8), free(i64), free(f64), free(whole), free(mine);
}

static void check_all_gather(ncclComm_t comm, int rank, ncclDataType_t t, size_t count, int in_place) {
  const int call = ++call_no;
  const size_t es = size_of(t);
  char* recv = calloc(1, count * es * world + 1);
  char* send = in_place ? recv + rank * count * es : calloc(1, count * es + 1);
  for (size_t i = 0; i < count; ++i) store(t, send, i, input(t, call, rank, i));
  EXPECT(ncclAllGather(send, recv, count, t, comm, NULL), ncclSuccess);
  int bad = 0;
  for (int q = 0; q < world && bad < 3; ++q) {
    for (size_t i = 0; i < count && bad < 3; ++i) {
      double got = load(t, recv + q * count * es, i), want = input(t, call, q, i);
      if (got != want) {
        CHECK(0, "all_gather %s count %zu%s: rank %d's element %zu is %g, expected %g", name_of(t), count,
              in_place ? " in place" : "", q, i, got, want);
        ++bad;
      }
    }
  }
  if (!in_place) free(send);
  free(recv);
}

static void check_reduce_scatter(ncclComm_t comm, int rank, ncclDataType_t t, size_t count, int in_place) {
  const int call = ++call_no;
  const size_t es = size_of(t);
  char* send = calloc(1, count * es * world + 1);
  char* recv = in_place ? send + rank * count * es : calloc(1, count * es + 1);
  for (size_t i = 0; i < count * world; ++i) store(t, send, i, input(t, call, rank, i));
  EXPECT(ncclReduceScatter(send, recv, count, t, ncclSum, comm, NULL), ncclSuccess);
  int bad = 0;
  for (size_t i = 0; i < count && bad < 3; ++i) {
    double want = 0;
    for (int q = 0; q < world; ++q) want += input(t, call, q, rank * count + i);
    double got = load(t, recv, i);
    if (!close_to(got, want, tolerance(t))) {
      CHECK(0, "reduce_scatter %s count %zu%s: element %zu is %g, expected %g", name_of(t), count,
            in_place ? " in place" : "", i, got, want);
      ++bad;
    }
  }
  if (!in_place) free(recv);
  free(send);
}

static void check_broadcast(ncclComm_t comm, int rank, ncclDataType_t t, size_t count, int root, int bcast) {
  const int call = ++call_no;
  const size_t es = size_of(t);
  char* send = calloc(1, count * es + 1);
  char* recv = bcast ? send : calloc(1, count * es + 1);
  for (size_t i = 0; i < count; ++i) store(t, send, i, input(t, call, rank, i));
  if (bcast) EXPECT(ncclBcast(send, count, t, root, comm, NULL), ncclSuccess);
  else EXPECT(ncclBroadcast(send, recv, count, t, root, comm, NULL), ncclSuccess);
  int bad = 0;
  for (size_t i = 0; i < count && bad < 3; ++i) {
    double got = load(t, recv, i), want = input(t, call, root, i);
    if (got != want) {
      CHECK(0, "%s %s count %zu root %d: element %zu is %g, expected %g", bcast ? "bcast" : "broadcast", name_of(t),
            count, root, i, got, want);
      ++bad;
    }
  }
  if (!bcast) free(recv);
  free(send);
}

/* Every rank sends to the next and receives from the previous, in one group, with an all-reduce beside them. */
static void check_group(ncclComm_t comm, int rank, size_t count) {
  const int call = ++call_no;
  float* to_next = calloc(1, count * 4);
  float* from_prev = calloc(1, count * 4);
  float* summed = calloc(1, count * 4);
  for (size_t i = 0; i < count; ++i) to_next[i] = summed[i] = (float)input(ncclFloat32, call, rank, i);
  const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  EXPECT(ncclGroupStart(), ncclSuccess);
  EXPECT(ncclSend(to_next, count, ncclFloat32, next, comm, NULL), ncclSuccess);
  EXPECT(ncclRecv(from_prev, count, ncclFloat32, prev, comm, NULL), ncclSuccess);
  EXPECT(ncclGroupStart(), ncclSuccess); /* nested: runs at the outer end */
  EXPECT(ncclAllReduce(summed, summed, count, ncclFloat32, ncclSum, comm, NULL), ncclSuccess);
  EXPECT(ncclGroupEnd(), ncclSuccess);
  EXPECT(ncclGroupEnd(), ncclSuccess);
  int bad = 0;
  for (size_t i = 0; i < count && bad < 3; ++i) {
    double want = input(ncclFloat32, call, prev, i), sum = 0;
    for (int q = 0; q < world; ++q) sum += input(ncclFloat32, call, q, i);
    if (from_prev[i] != (float)want || !close_to(summed[i], sum, 1e-5)) {
      CHECK(0, "group: element %zu received %g (expected %g), summed %g (expected %g)", i, from_prev[i], want,
            summed[i], sum);
      ++bad;
    }
  }
  free(to_next);
  free(from_prev);
  free(summed);
}

/* ncclCommSplit: color rank % 2 (the last of 3 or more ranks: no color), new ranks in reverse order (key), and an
 * all-reduce on the new communicator. */
static void check_split(ncclComm_t comm, int rank) {
  const int nocolor = world > 2 && rank == world - 1;
  const int color = nocolor ? NCCL_SPLIT_NOCOLOR : rank % 2;
  ncclComm_t sub = (ncclComm_t)1;
  EXPECT(ncclCommSplit(comm, color, world - rank, &sub, NULL), ncclSuccess);
  if (nocolor) {
    CHECK(sub == NULL, "no color gives no communicator");
    return;
  }
  int members[64], n = 0, me = -1;
  for (int q = world - 1; q >= 0; --q) { /* by key: reverse rank order */
    if (!(world > 2 && q == world - 1) && q % 2 == color) {
      if (q == rank) me = n;
      members[n++] = q;
    }
  }
  int count = -1, r = -1;
  EXPECT(ncclCommCount(sub, &count), ncclSuccess);
  EXPECT(ncclCommUserRank(sub, &r), ncclSuccess);
  CHECK(count == n && r == me, "split: %d ranks (expected %d), rank %d (expected %d)", count, n, r, me);
  const int call = ++call_no;
  float x[100];
  for (int i = 0; i < 100; ++i) x[i] = (float)input(ncclFloat32, call, rank, i);
  EXPECT(ncclAllReduce(x, x, 100, ncclFloat32, ncclSum, sub, NULL), ncclSuccess);
  for (int i = 0; i < 100; ++i) {
    double want = 0;
    for (int k = 0; k < n; ++k) want += input(ncclFloat32, call, members[k], i);
    if (!close_to(x[i], want, 1e-5)) {
      CHECK(0, "split all_reduce element %d is %g, expected %g", i, x[i], want);
      break;
    }
  }
  EXPECT(ncclCommDestroy(sub), ncclSuccess);
}

static void check_all_to_all(ncclComm_t comm, int rank, ncclDataType_t t, size_t count, int in_place) {
  const int call = ++call_no;
  const size_t es = size_of(t), n = count * world;
  char* send = calloc(1, n * es + 1);
  char* recv = in_place ? send : calloc(1, n * es + 1);
  for (size_t i = 0; i < n; ++i) store(t, send, i, input(t, call, rank, i));
  EXPECT(ncclAlltoAll(send, recv, count, t, comm, NULL), ncclSuccess);
  int bad = 0;
  for (int q = 0; q < world && bad < 3; ++q) {
    for (size_t i = 0; i < count && bad < 3; ++i) {
      /* From rank q: the block q sent to this rank. */
      double got = load(t, recv + q * count * es, i), want = input(t, call, q, rank * count + i);
      if (got != want) {
        CHECK(0, "all_to_all %s count %zu%s: from rank %d, element %zu is %g, expected %g", name_of(t), count,
              in_place ? " in place" : "", q, i, got, want);
        ++bad;
      }
    }
  }
  if (!in_place) free(recv);
  free(send);
}

/* The calls of newer NCCLs: windows, suspension, and what needs NCCL's own communicator. */
static void check_newer_calls(ncclComm_t comm, int rank) {
  call_no = 1000; /* the same inputs on every rank, whatever ran before on some of them (a split's members) */
  float a[64], b[64];
  memset(a, 0, sizeof(a));
  ncclWindow_t win = NULL;
  EXPECT(ncclCommWindowRegister(comm, a, sizeof(a), &win, 0), ncclSuccess);
  CHECK(win != NULL, "a window handle");
  EXPECT(ncclCommWindowDeregister(comm, win), ncclSuccess);
  EXPECT(ncclCommWindowRegister(comm, a, sizeof(a), NULL, 0), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(comm), "'win'") != NULL, "names win: %s", ncclGetLastError(comm));

  EXPECT(ncclCommSuspend(comm, 1), ncclSuccess);
  EXPECT(ncclCommSuspend(comm, 1), ncclSuccess); /* idempotent */
  EXPECT(ncclAllReduce(a, b, 16, ncclFloat32, ncclSum, comm, NULL), ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(comm), "suspended") != NULL, "says suspended: %s", ncclGetLastError(comm));
  EXPECT(ncclCommResume(comm), ncclSuccess);
  check_all_reduce(comm, rank, ncclFloat32, 500, ncclSum, 0);

  ncclComm_t shrunk = (ncclComm_t)a;
  int excluded = world - 1;
  EXPECT(ncclCommShrink(comm, &excluded, 1, &shrunk, NULL, 0), ncclInvalidUsage);
  CHECK(shrunk == NULL, "no communicator from a refused shrink");
  CHECK(strstr(ncclGetLastError(comm), "ncclCommSplit") != NULL, "says what to do: %s", ncclGetLastError(comm));
  EXPECT(ncclDevCommCreate(comm, NULL, NULL), ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(comm), "device API") != NULL, "says why: %s", ncclGetLastError(comm));
  EXPECT(ncclGroupSimulateEnd(NULL), ncclInvalidUsage);
  EXPECT(ncclGroupStart(), ncclSuccess);
  EXPECT(ncclGroupSimulateEnd(NULL), ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(NULL), "ncclGroupEnd") != NULL, "says the group stays open: %s",
        ncclGetLastError(NULL));
  EXPECT(ncclGroupEnd(), ncclSuccess);
  EXPECT(ncclGather(a, b, 4, ncclFloat32, 0, comm, NULL), ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(comm), "real NCCL") != NULL, "says why: %s", ncclGetLastError(comm));
  EXPECT(ncclScatter(a, b, 4, ncclFloat32, 0, comm, NULL), ncclInvalidUsage);
}

/* ncclCommInitRankScalable: every rank holds the same ids; the ranks meet on the first. */
static void check_init_scalable(ncclUniqueId first, ncclUniqueId second, int rank) {
  ncclUniqueId ids[2] = {first, second};
  call_no = 2000;
  ncclComm_t comm = NULL;
  EXPECT(ncclCommInitRankScalable(&comm, world, rank, 2, ids, NULL), ncclSuccess);
  if (comm == NULL) return;
  check_all_reduce(comm, rank, ncclBfloat16, 3000, ncclSum, 1);
  EXPECT(ncclCommDestroy(comm), ncclSuccess);
}

static void check_errors_with_comm(ncclComm_t comm, int rank) {
  float a[64], b[64];
  memset(a, 0, sizeof(a));
  EXPECT(ncclAllReduce(a, b, 16, (ncclDataType_t)99, ncclSum, comm, NULL), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(comm), "datatype") != NULL, "names datatype: %s", ncclGetLastError(comm));
  EXPECT(ncclAllReduce(a, b, 16, ncclFloat32, (ncclRedOp_t)17, comm, NULL), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(comm), "'op'") != NULL, "names op: %s", ncclGetLastError(comm));
  EXPECT(ncclAllReduce(a, a + 1, 16, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(comm), "recvbuff") != NULL, "names recvbuff: %s", ncclGetLastError(comm));
  EXPECT(ncclAllReduce(NULL, b, 16, ncclFloat32, ncclSum, comm, NULL), ncclInvalidArgument);
  EXPECT(ncclBroadcast(a, b, 16, ncclFloat32, world, comm, NULL), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(comm), "root") != NULL, "names root: %s", ncclGetLastError(comm));
  EXPECT(ncclSend(a, 16, ncclFloat32, rank, comm, NULL), ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(comm), "peer") != NULL, "names peer: %s", ncclGetLastError(comm));
  EXPECT(ncclReduce(a, b, 16, ncclFloat32, ncclSum, 0, comm, NULL), ncclInvalidUsage);
  CHECK(strstr(ncclGetLastError(comm), "real NCCL") != NULL, "says why: %s", ncclGetLastError(comm));
}

static int run_rank(ncclUniqueId id, ncclUniqueId id2, ncclUniqueId id3, int rank) {
  ncclComm_t comm = NULL;
  EXPECT(ncclCommInitRank(&comm, world, id, rank), ncclSuccess);
  if (comm == NULL) return 1;
  int n = -1, r = -1, dev = 7;
  EXPECT(ncclCommCount(comm, &n), ncclSuccess);
  EXPECT(ncclCommUserRank(comm, &r), ncclSuccess);
  EXPECT(ncclCommCuDevice(comm, &dev), ncclSuccess);
  CHECK(n == world && r == rank && dev == -1, "count %d rank %d device %d", n, r, dev);

  const ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclFloat16};
  const size_t counts[] = {1, 1000, 40000}; /* LL and HB kernels in host mode */
  for (int ti = 0; ti < 3; ++ti) {
    for (int ci = 0; ci < 3; ++ci) {
      for (int in_place = 0; in_place < 2; ++in_place) {
        check_all_reduce(comm, rank, types[ti], counts[ci], ncclSum, in_place);
        check_all_gather(comm, rank, types[ti], counts[ci], in_place);
        check_reduce_scatter(comm, rank, types[ti], counts[ci], in_place);
        check_all_to_all(comm, rank, types[ti], counts[ci], in_place);
      }
      check_broadcast(comm, rank, types[ti], counts[ci], world - 1, 0);
      check_broadcast(comm, rank, types[ti], counts[ci], 0, 1);
    }
  }
  check_all_reduce(comm, rank, ncclFloat32, 4096, ncclMax, 0);
  check_all_reduce(comm, rank, ncclFloat32, 4096, ncclAvg, 1);
  check_exact_reductions(comm, rank, 37);
  check_exact_reductions(comm, rank, 5000);
  check_group(comm, rank, 3000);
  check_split(comm, rank);
  check_errors_with_comm(comm, rank);
  check_newer_calls(comm, rank);
  check_init_scalable(id2, id3, rank);
  ncclResult_t async = ncclInternalError;
  EXPECT(ncclCommGetAsyncError(comm, &async), ncclSuccess);
  CHECK(async == ncclSuccess, "async error %d", (int)async);
  const char* described = pycclNcclDescribe(comm);
  CHECK(strstr(described, "all_reduce kernel") != NULL, "trace lists the all-reduces: %s", described);
  if (rank == 0) printf("%s", described);
  EXPECT(ncclCommDestroy(comm), ncclSuccess);
  if (failures == 0) printf("ok rank %d\n", rank);
  return failures != 0;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s WORLD SEED\n", argv[0]);
    return 2;
  }
  world = atoi(argv[1]);
  seed = (unsigned)strtoul(argv[2], NULL, 10);
  setvbuf(stdout, NULL, _IOLBF, 0);
  check_errors_without_comm();
  ncclUniqueId id, id2, id3;
  EXPECT(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT(ncclGetUniqueId(&id2), ncclSuccess);
  EXPECT(ncclGetUniqueId(&id3), ncclSuccess);
  fflush(NULL);
  pid_t children[64];
  for (int r = 1; r < world; ++r) {
    children[r] = fork();
    if (children[r] == 0) _exit(run_rank(id, id2, id3, r));
  }
  int status = run_rank(id, id2, id3, 0);
  for (int r = 1; r < world; ++r) {
    int s = 0;
    waitpid(children[r], &s, 0);
    if (!WIFEXITED(s) || WEXITSTATUS(s) != 0) {
      fprintf(stderr, "FAILED: rank %d exited with status %d\n", r, s);
      status = 1;
    }
  }
  return status != 0 || failures != 0;
}
