// Command schemagen writes the shape of a lab topology (topo.SchemaJSON) to the file named by
// its argument: `go generate ./internal/topo` runs it to write
// analytics/src/flowplane_analytics/lab_schema.json, from which flowplane-analytics checks
// topologies by the same rules as `flowplane lab up`.
package main

import (
	"fmt"
	"os"

	"github.com/flowplane/flowplane/internal/topo"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: schemagen OUTPUT.json")
		os.Exit(2)
	}
	b, err := topo.SchemaJSON()
	if err == nil {
		err = os.WriteFile(os.Args[1], b, 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "schemagen: %v\n", err)
		os.Exit(1)
	}
}
