package main

import (
	"fmt"
	"time"
)

// Cost is the cost model that stands in for the GPU: the replay computes
// no model, and charges each request the time its prefill, its loads and
// its decodes would take.
//
// Prefill of n tokens after c tokens already in KV takes
//
//	n / PrefillTPS * (1 + PrefillGrowth * (c + n/2) / 1000)
//
// seconds: a token's projections and MLP cost the same anywhere, its
// attention grows with the context before it (on average c + n/2 tokens).
// Loading e tokens of external KV takes e * KVBytesPerToken / LoadBps.
// Decoding m tokens takes m * DecodeTime.
//
// The defaults are Llama-3.1-8B (BF16 weights and KV) on one NVIDIA H100
// SXM, derived from the model's shape (Llama 3.1 model card: 32 layers,
// hidden size 4096, 8 KV heads of 128) and the GPU's datasheet (989 TFLOPS
// dense BF16, 3.35 TB/s HBM3) as Kaplan et al. (2020, "Scaling Laws for
// Neural Language Models", section 2.1) count a forward pass: 2N FLOPs a
// token for N = 8.0e9 parameters, plus 2 * layers * hidden * 2 = 524,288
// FLOPs a token for each token of context (QK^T and AV). At 50% model
// FLOPs utilisation that is 31,000 prefill tokens a second, growing 3.3%
// a token for each 1,000 tokens of context; a decode step reads the 16 GB
// of weights once, 4.8 ms at the HBM's bandwidth, 6 ms with overheads.
// KV is 2 * 32 * 8 * 128 * 2 bytes = 131,072 bytes a token; loads come at
// 25 GB/s (one 200 Gb/s RDMA NIC, as Mooncake's paper deploys per GPU).
type Cost struct {
	Model           string        // what the figures describe
	PrefillTPS      float64       // prefill tokens per second at no context
	PrefillGrowth   float64       // extra prefill time per token, per 1,000 tokens of context (0.033 = 3.3%)
	DecodeTime      time.Duration // time of one decode step of one request
	KVBytesPerToken int64         // the model's KV bytes per token, for load times
	LoadBps         float64       // external KV load bandwidth, bytes per second
}

// DefaultCost is Llama-3.1-8B on one H100 SXM; see [Cost].
var DefaultCost = Cost{
	Model:           "Llama-3.1-8B BF16 on 1x H100 SXM (derived: 2N FLOPs/token at 50% of 989 TFLOPS; 3.35 TB/s)",
	PrefillTPS:      31000,
	PrefillGrowth:   0.033,
	DecodeTime:      6 * time.Millisecond,
	KVBytesPerToken: 131072,
	LoadBps:         25e9,
}

// Validate names the first parameter out of range.
func (c Cost) Validate() error {
	switch {
	case !(c.PrefillTPS > 0):
		return fmt.Errorf("-prefill-tps = %v, want > 0", c.PrefillTPS)
	case !(c.PrefillGrowth >= 0):
		return fmt.Errorf("-prefill-growth = %v, want >= 0", c.PrefillGrowth)
	case c.DecodeTime < 0:
		return fmt.Errorf("-decode-time = %v, want >= 0", c.DecodeTime)
	case c.KVBytesPerToken < 0:
		return fmt.Errorf("-model-kv-bytes = %v, want >= 0", c.KVBytesPerToken)
	case !(c.LoadBps > 0):
		return fmt.Errorf("-load-gbps = %v, want > 0", c.LoadBps/1e9)
	}
	return nil
}

// Prefill returns the time to compute n tokens after c tokens of context.
func (c Cost) Prefill(n, ctx int) time.Duration {
	if n <= 0 {
		return 0
	}
	s := float64(n) / c.PrefillTPS * (1 + c.PrefillGrowth*(float64(ctx)+float64(n)/2)/1000)
	return time.Duration(s * float64(time.Second))
}

// Load returns the time to load n tokens of external KV.
func (c Cost) Load(n int) time.Duration {
	return time.Duration(float64(n) * float64(c.KVBytesPerToken) / c.LoadBps * float64(time.Second))
}

// Decode returns the time to decode m tokens.
func (c Cost) Decode(m int) time.Duration { return time.Duration(m) * c.DecodeTime }
