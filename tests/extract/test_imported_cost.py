"""extract.imported_cost: the imported program's e-node DAG cost without rebuilding it, the
figure extract(eg, root).cost gives, on both targets; after a rule ran, extract's."""
import pytest

import apsat
from apsat.explore.egraph import EGraph
from apsat.extract import extract, imported_cost
from apsat.pipeline.zoo import light_model_paths

SQUEEZENET = next(p for p in light_model_paths() if "squeezenet" in p.stem)


@pytest.mark.parametrize("target", ["gpu", "systolic:32x32"])
def test_the_imported_program_costs_what_extract_says(target):
    eg = EGraph(target=target)
    handles = eg.add_outputs(apsat.load_onnx(SQUEEZENET).program)
    assert imported_cost(eg, handles) == extract(eg, handles).cost > 0


def test_after_a_rule_ran_it_is_the_extracted_cost():
    """Two relus become one chain: the class holds two nodes, so this is extract's cost."""
    eg = EGraph(target="gpu")
    program = apsat.parse("(compute relu (compute relu (access (access-tensor x) 1)))", {"x": (4, 8)})
    root = eg.add(program)
    eg.saturate(rules=["fusion"])
    assert eg.size()[0] > len(program.terms())
    assert imported_cost(eg, root) == extract(eg, root).cost
