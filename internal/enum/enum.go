// Package enum names the values of logbus's small integer enumerations,
// each from one table: a type's String is its table and one call, so a
// new value is named where it is declared, once.
package enum

import "fmt"

// Name returns names[v], or typ(v) for a value names has no name for
// (out of range, or an empty entry).
func Name[T ~int | ~int8 | ~int16 | ~int32 | ~int64](names []string, typ string, v T) string {
	if v >= 0 && int64(v) < int64(len(names)) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, int64(v))
}
