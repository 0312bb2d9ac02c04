/* One LSTM time step's element-wise part, forward and back, as one launch
 * each (sparkavg/ops/reference_sequence.py: the twin and its layouts).
 *
 * Gate rows are C-contiguous (N, 4U) with gate blocks of U columns in
 * PyTorch's order (input, forget, cell, output); states are (N, U).  One
 * thread per (row, unit).  The terms are the reference's, in its order;
 * sigmoid is 0.5 * tanh(0.5 * a) + 0.5 as there (it cannot overflow).
 */
#include "spk.cuh"

#if defined(__CUDACC__)
SPK_DEV T spk_tanh(T a) { return tanh(a); } /* the float overload for float */
#else
#include <math.h>
SPK_DEV T spk_tanh(T a) { return sizeof(T) == sizeof(float) ? (T)tanhf((float)a) : (T)tanh((double)a); }
#endif

SPK_DEV T spk_sigmoid(T a) { return (T)0.5 * spk_tanh((T)0.5 * a) + (T)0.5; }

/* z: IN x W + b, OUT the gates' activations; rec: h_prev @ RW;
 * c = f * c_prev + i * g, tc = tanh(c), h = o * tc. */
SPK_KERNEL sparkavg_lstm_forward_step(T *SPK_RESTRICT z, const T *SPK_RESTRICT rec,
                                      const T *SPK_RESTRICT c_prev, T *SPK_RESTRICT c,
                                      T *SPK_RESTRICT tc, T *SPK_RESTRICT h, I total, I u)
{
    SPK_FOR(t, total) {
        const I n = t / u, k = t - n * u;
        T *SPK_RESTRICT zr = z + n * 4 * u;
        const T *SPK_RESTRICT rr = rec + n * 4 * u;
        const T ig = spk_sigmoid(zr[k] + rr[k]);
        const T fg = spk_sigmoid(zr[u + k] + rr[u + k]);
        const T gg = spk_tanh(zr[2 * u + k] + rr[2 * u + k]);
        const T og = spk_sigmoid(zr[3 * u + k] + rr[3 * u + k]);
        zr[k] = ig;
        zr[u + k] = fg;
        zr[2 * u + k] = gg;
        zr[3 * u + k] = og;
        T cn = fg * c_prev[t];
        cn += ig * gg;
        const T tn = spk_tanh(cn);
        c[t] = cn;
        tc[t] = tn;
        h[t] = og * tn;
    }
}

/* a: the gates' activations; dh: dL/dh of the step; dc: IN dL/dc from the
 * next step, OUT f times the total; dz: OUT dL/d(pre-activations). */
SPK_KERNEL sparkavg_lstm_backward_step(const T *SPK_RESTRICT a, const T *SPK_RESTRICT c_prev,
                                       const T *SPK_RESTRICT tc, const T *SPK_RESTRICT dh,
                                       T *SPK_RESTRICT dc, T *SPK_RESTRICT dz, I total, I u)
{
    SPK_FOR(t, total) {
        const I n = t / u, k = t - n * u;
        const T *SPK_RESTRICT ar = a + n * 4 * u;
        T *SPK_RESTRICT dr = dz + n * 4 * u;
        const T ig = ar[k], fg = ar[u + k], gg = ar[2 * u + k], og = ar[3 * u + k];
        const T th = tc[t], g = dh[t];
        const T d = dc[t] + g * og * ((T)1 - th * th);
        dr[k] = d * gg * ig * ((T)1 - ig);
        dr[u + k] = d * c_prev[t] * fg * ((T)1 - fg);
        dr[2 * u + k] = d * ig * ((T)1 - gg * gg);
        dr[3 * u + k] = g * th * og * ((T)1 - og);
        dc[t] = d * fg;
    }
}
