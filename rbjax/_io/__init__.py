"""Model files in and out: MJCF/URDF through MuJoCo (:mod:`.mujoco`)."""
