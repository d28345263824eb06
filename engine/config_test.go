package engine

import (
	"errors"
	"testing"
	"time"
)

func TestRetryPolicyDelay(t *testing.T) {
	p, err := RetryPolicy{BaseDelay: 10 * time.Millisecond, Multiplier: 3, MaxDelay: 200 * time.Millisecond}.Resolve()
	if err != nil {
		t.Fatal(err)
	}
	for attempt, want := range map[int]time.Duration{
		1: 10 * time.Millisecond, 2: 30 * time.Millisecond, 3: 90 * time.Millisecond,
		4: 200 * time.Millisecond, 100: 200 * time.Millisecond, 5000: 200 * time.Millisecond,
	} {
		if got := p.Delay(attempt); got != want {
			t.Errorf("Delay(%d) = %v, want %v", attempt, got, want)
		}
	}
}

func TestRetryPolicyResolve(t *testing.T) {
	got, err := RetryPolicy{}.Resolve()
	want := RetryPolicy{DefaultMaxAttempts, DefaultBaseDelay, DefaultMultiplier, DefaultMaxDelay}
	if err != nil || got != want {
		t.Errorf("zero policy resolves to %+v, %v; want %+v", got, err, want)
	}
	for name, bad := range map[string]RetryPolicy{
		"negative attempts":   {MaxAttempts: -1},
		"negative base":       {BaseDelay: -1},
		"negative max":        {MaxDelay: -1},
		"shrinking multplier": {Multiplier: 0.5},
	} {
		if _, err := bad.Resolve(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}

func TestRetentionResolve(t *testing.T) {
	got, err := Retention{}.Resolve()
	if err != nil || got.MaxMessages != DefaultMaxMessages || got.BlockTimeout != DefaultBlockTimeout || got.OnFull != Block {
		t.Errorf("zero retention resolves to %+v, %v", got, err)
	}
	for name, bad := range map[string]Retention{
		"negative capacity": {MaxMessages: -1},
		"negative age":      {MaxAge: -time.Second},
		"negative timeout":  {BlockTimeout: -time.Second},
		"unknown policy":    {OnFull: FullPolicy(7)},
	} {
		if _, err := bad.Resolve(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}

func TestGroupSpecResolve(t *testing.T) {
	broker := RetryPolicy{MaxAttempts: 5, BaseDelay: time.Millisecond, Multiplier: 2, MaxDelay: time.Second}
	for name, tc := range map[string]struct{ spec, want GroupSpec }{
		"zero":            {GroupSpec{}, GroupSpec{Retry: broker, DeadLetterLimit: DefaultDeadLetterLimit, KeyConcurrency: 1}},
		"own retry":       {GroupSpec{Retry: RetryPolicy{MaxAttempts: 1}}, GroupSpec{Retry: RetryPolicy{1, DefaultBaseDelay, DefaultMultiplier, DefaultMaxDelay}, DeadLetterLimit: DefaultDeadLetterLimit, KeyConcurrency: 1}},
		"no dead letters": {GroupSpec{DeadLetterLimit: NoDeadLetters}, GroupSpec{Retry: broker, DeadLetterLimit: NoDeadLetters, KeyConcurrency: 1}},
		"latest":          {GroupSpec{DeadLetterLimit: 7, Start: Start{Kind: StartLatest}}, GroupSpec{Retry: broker, DeadLetterLimit: 7, Start: Start{Kind: StartLatest}, KeyConcurrency: 1}},
		"key concurrency": {GroupSpec{KeyConcurrency: MaxKeyConcurrency}, GroupSpec{Retry: broker, DeadLetterLimit: DefaultDeadLetterLimit, KeyConcurrency: MaxKeyConcurrency}},
	} {
		got, err := tc.spec.Resolve(broker)
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("%s: Resolve = %+v, %v; want %+v", name, got, err, tc.want)
		}
	}
	for name, bad := range map[string]GroupSpec{
		"negative attempts":     {Retry: RetryPolicy{MaxAttempts: -1}},
		"negative limit":        {DeadLetterLimit: -2},
		"negative offset":       {Start: Start{Kind: StartOffset, Offset: -1}},
		"unknown kind of start": {Start: Start{Kind: 9}},
		"negative concurrency":  {KeyConcurrency: -1},
		"too much concurrency":  {KeyConcurrency: MaxKeyConcurrency + 1},
	} {
		if _, err := bad.Resolve(broker); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
}
