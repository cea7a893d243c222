package topo

import (
	"fmt"
	"strings"
)

// Error is one problem in a topology file: where it is and how to fix it.
type Error struct {
	File  string
	Line  int    // 0 when the problem is the file as a whole
	Field string // path of the key, e.g. links[1].rate
	Msg   string
}

func (e Error) Error() string {
	where := e.File
	if e.Line > 0 {
		where = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Field == "" {
		return where + ": " + e.Msg
	}
	return where + ": " + e.Field + ": " + e.Msg
}

// Errors is every problem found in one file; validation does not stop at the first.
type Errors []Error

func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

type errorList struct {
	file string
	errs Errors
}

func (l *errorList) add(line int, field, format string, args ...any) {
	l.errs = append(l.errs, Error{File: l.file, Line: line, Field: field, Msg: fmt.Sprintf(format, args...)})
}
