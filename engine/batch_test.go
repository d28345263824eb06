package engine

import (
	"errors"
	"testing"
	"time"
)

func TestBatchSpecResolve(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   BatchSpec
		want BatchSpec
		err  bool
	}{
		{"zero means the defaults", BatchSpec{}, BatchSpec{MaxSize: DefaultBatchSize}, false},
		{"one record", BatchSpec{MaxSize: 1}, BatchSpec{MaxSize: 1}, false},
		{"the bound", BatchSpec{MaxSize: MaxBatchSize, MaxWait: time.Second}, BatchSpec{MaxSize: MaxBatchSize, MaxWait: time.Second}, false},
		{"past the bound", BatchSpec{MaxSize: MaxBatchSize + 1}, BatchSpec{}, true},
		{"a negative size", BatchSpec{MaxSize: -1}, BatchSpec{}, true},
		{"a negative wait", BatchSpec{MaxWait: -time.Nanosecond}, BatchSpec{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.in.Resolve()
			switch {
			case tc.err && !errors.Is(err, ErrInvalid):
				t.Errorf("Resolve(%+v): got error %v, want one wrapping ErrInvalid", tc.in, err)
			case !tc.err && err != nil:
				t.Errorf("Resolve(%+v): got error %v, want nil", tc.in, err)
			case !tc.err && got != tc.want:
				t.Errorf("Resolve(%+v): got %+v, want %+v", tc.in, got, tc.want)
			}
		})
	}
}
