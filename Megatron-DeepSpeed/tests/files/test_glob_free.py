"""glob_free (megatron/files/glob_free.py): a directory whose path has glob characters is handed over as a link
without them, which globbing and opening both find; a plain path is handed over as it is."""
import glob
import os

from megatron.files.glob_free import glob_free


def test_a_plain_path_is_itself(tmp_path):
    with glob_free(str(tmp_path)) as directory:
        assert directory == str(tmp_path)


def test_a_path_with_glob_characters_is_a_link_that_globs_and_opens_and_ends_with_the_block(tmp_path):
    run = tmp_path / "run[lr=1e-3]"
    (run / "global_step2").mkdir(parents=True)
    (run / "global_step2" / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    assert glob.glob(os.path.join(str(run), "global_step2", "*.pt")) == []  # why the link is needed
    with glob_free(str(run)) as directory:
        assert not glob.has_magic(directory)
        found = glob.glob(os.path.join(directory, "global_step2", "*.pt"))
        assert [os.path.basename(path) for path in found] == ["mp_rank_00_model_states.pt"]
        assert open(found[0], "rb").read() == b"weights"
    assert not os.path.lexists(directory) and run.is_dir()
