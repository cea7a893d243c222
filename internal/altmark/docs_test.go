package altmark

import (
	"slices"
	"testing"

	"github.com/flowplane/flowplane/internal/doccheck"
)

// docs/altmark.md documents every key the probe's and the marker's decoders accept, in their
// configuration reference tables, and nothing they do not.
func TestDocConfigKeys(t *testing.T) {
	t.Parallel()
	page, err := doccheck.Read("../../docs/altmark.md")
	if err != nil {
		t.Fatal(err)
	}
	probe := slices.Concat(configKeys, doccheck.Prefixed("interfaces[].", interfaceKeys), doccheck.Prefixed("ipfix.", ipfixKeys))
	mark := slices.Concat(markKeys, doccheck.Prefixed("double.", doubleKeys), doccheck.Prefixed("select.", selectKeys))
	for _, p := range slices.Concat(page.KeyProblems("Probe configuration", probe), page.KeyProblems("Marker configuration", mark)) {
		t.Error(p)
	}
}

// docs/altmark.md names every command and flag of `flowplane altmark`.
func TestDocCommands(t *testing.T) {
	t.Parallel()
	page, err := doccheck.Read("../../docs/altmark.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range page.CommandProblems(Command()) {
		t.Error(p)
	}
}
