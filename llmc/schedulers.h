// schedulers.h: the learning-rate schedule (-l base lr, -u warmup, -k kind, -q final fraction, -x steps).
//
// Steps are 0-based: lr_at(0) is the rate of the first optimizer step.
//
//   min_lr = base_lr * final_fraction
//
//   warmup (every kind), step < warmup:
//       lr = base_lr * (step + 1) / warmup            (linear ramp; the first step is not 0)
//
//   after warmup, with progress p = (step - warmup) / (total_steps - warmup), clamped to [0, 1]
//   (p = 1 when total_steps <= warmup):
//       cosine:   lr = min_lr + 0.5 * (1 + cos(pi * p)) * (base_lr - min_lr)
//       linear:   lr = base_lr - p * (base_lr - min_lr)
//       constant: lr = base_lr                         (final_fraction is ignored)
//       wsd:      warmup-stable-decay: base_lr until the decay window, which is the last 20% of
//                 total_steps: it starts at decay_start = total_steps - floor(total_steps / 5)
//                 (or at warmup, if that is later). Inside it, with
//                 q = (step - decay_start) / (total_steps - decay_start) clamped to [0, 1],
//                   lr = min_lr + (base_lr - min_lr) * (1 - sqrt(q))
//                 a "1 - sqrt" cooldown: it drops fastest at the start of the window.
// As in llm.c, p (and q) reach 1 at step == total_steps, one past the last step, so the last
// step's lr is slightly above min_lr; steps past the end stay at min_lr (cosine, linear, wsd).
#pragma once
#include <cmath>
#include <string>
#include "common.h"

namespace llmc {

struct LRSchedule {
    enum Kind { COSINE, LINEAR, CONSTANT, WSD };
    Kind kind = COSINE;
    float base_lr = 6e-4f;
    int warmup = 0;
    int total_steps = 1;
    float final_fraction = 0.1f;

    float lr_at(int step) const {
        const double base = base_lr;
        if (step < warmup) return (float)(base * (double)(step + 1) / (double)warmup);
        const double min_lr = base * (double)final_fraction;
        switch (kind) {
        case CONSTANT:
            return base_lr;
        case COSINE: {
            const double p = clamp01(ratio(step - warmup, total_steps - warmup));
            const double pi = 3.14159265358979323846;
            return (float)(min_lr + 0.5 * (1.0 + std::cos(pi * p)) * (base - min_lr));
        }
        case LINEAR: {
            const double p = clamp01(ratio(step - warmup, total_steps - warmup));
            return (float)(base - p * (base - min_lr));
        }
        case WSD: {
            int decay_start = total_steps - total_steps / 5;
            if (decay_start < warmup) decay_start = warmup;
            if (step < decay_start) return base_lr;
            const double q = clamp01(ratio(step - decay_start, total_steps - decay_start));
            return (float)(min_lr + (base - min_lr) * (1.0 - std::sqrt(q)));
        }
        }
        return base_lr;   // not reached
    }

private:
    // num / den, with an empty window (den <= 0) counting as finished
    static double ratio(int num, int den) { return den > 0 ? (double)num / (double)den : 1.0; }
    static double clamp01(double x) { return x < 0.0 ? 0.0 : (x > 1.0 ? 1.0 : x); }
};

// "-k" value to Kind; throws InputError for anything else.
inline LRSchedule::Kind parse_schedule_kind(const std::string& s) {
    if (s == "cosine") return LRSchedule::COSINE;
    if (s == "linear") return LRSchedule::LINEAR;
    if (s == "constant") return LRSchedule::CONSTANT;
    if (s == "wsd") return LRSchedule::WSD;
    input_error("-k: unknown schedule '%s' (cosine, linear, constant, wsd)", s.c_str());
}

inline const char* schedule_kind_name(LRSchedule::Kind k) {
    switch (k) {
    case LRSchedule::COSINE: return "cosine";
    case LRSchedule::LINEAR: return "linear";
    case LRSchedule::CONSTANT: return "constant";
    case LRSchedule::WSD: return "wsd";
    }
    return "?";
}

} // namespace llmc
