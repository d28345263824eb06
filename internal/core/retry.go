package core

import (
	"fmt"
	"math"
	"time"
)

// RetryPolicy says how often a failing delivery is retried and how long the
// worker waits in between. Zero fields mean the defaults.
type RetryPolicy struct {
	MaxAttempts int           // deliveries before dead-lettering, first one included; default 3
	BaseDelay   time.Duration // wait after the first failure; default 10ms
	Multiplier  float64       // growth per further failure; default 2
	MaxDelay    time.Duration // cap on any one wait; default 1s
}

// Defaults of RetryPolicy.
const (
	DefaultMaxAttempts = 3
	DefaultBaseDelay   = 10 * time.Millisecond
	DefaultMultiplier  = 2.0
	DefaultMaxDelay    = time.Second
)

// Resolve checks p and fills its zero fields with the defaults.
func (p RetryPolicy) Resolve() (RetryPolicy, error) {
	switch {
	case p.MaxAttempts < 0:
		return p, fmt.Errorf("%w: retry MaxAttempts %d is negative", ErrInvalid, p.MaxAttempts)
	case p.BaseDelay < 0:
		return p, fmt.Errorf("%w: retry BaseDelay %v is negative", ErrInvalid, p.BaseDelay)
	case p.MaxDelay < 0:
		return p, fmt.Errorf("%w: retry MaxDelay %v is negative", ErrInvalid, p.MaxDelay)
	case p.Multiplier != 0 && (p.Multiplier < 1 || math.IsNaN(p.Multiplier) || math.IsInf(p.Multiplier, 0)):
		return p, fmt.Errorf("%w: retry Multiplier %v must be at least 1", ErrInvalid, p.Multiplier)
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseDelay == 0 {
		p.BaseDelay = DefaultBaseDelay
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = DefaultMaxDelay
	}
	return p, nil
}

// Delay is the wait after the given failed attempt (1 for the first):
// min(MaxDelay, BaseDelay·Multiplier^(attempt−1)). There is no jitter: one
// in-process worker per partition has nobody to collide with.
func (p RetryPolicy) Delay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := float64(p.BaseDelay) * math.Pow(p.Multiplier, float64(attempt-1))
	if d >= float64(p.MaxDelay) { // also catches +Inf
		return p.MaxDelay
	}
	return time.Duration(d)
}
