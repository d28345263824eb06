package core

import (
	"errors"
	"testing"
)

// outcomeOf reads a batch handler's error: how many records from the
// first succeeded, and the error the next one failed with.
func TestOutcomeOf(t *testing.T) {
	boom := errors.New("boom")
	named := &BatchError{Index: 2}
	for _, tc := range []struct {
		name     string
		err      error
		wantDone int
		wantErr  error // nil: no failure; else errors.Is must hold
	}{
		{"nil acks every record", nil, 5, nil},
		{"a plain error fails the first record", boom, 0, boom},
		{"a BatchError acks the records before its index", &BatchError{Index: 3, Err: boom}, 3, boom},
		{"a BatchError at index 0 acks none", &BatchError{Index: 0, Err: boom}, 0, boom},
		{"a BatchError without Err fails with itself", named, 2, named},
		{"an index past the batch fails the first record as ErrInvalid", &BatchError{Index: 5, Err: boom}, 0, ErrInvalid},
		{"a negative index fails the first record as ErrInvalid", &BatchError{Index: -1, Err: boom}, 0, ErrInvalid},
		{"a wrapped BatchError is a plain error here: the typed layer unwraps it", errors.Join(boom, &BatchError{Index: 3}), 0, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, failed := outcomeOf(tc.err, 5)
			if done != tc.wantDone {
				t.Errorf("done: got %d, want %d", done, tc.wantDone)
			}
			switch {
			case tc.wantErr == nil && failed != nil:
				t.Errorf("failed: got %v, want nil", failed)
			case tc.wantErr != nil && !errors.Is(failed, tc.wantErr):
				t.Errorf("failed: got %v, want an error wrapping %v", failed, tc.wantErr)
			}
		})
	}
}
